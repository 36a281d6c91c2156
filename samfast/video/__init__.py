"""Video object tracking for trackers of SAM 2's design: samfast.VideoPredictor, its memory bank, the Tracker protocol.

Family-neutral: the predictor (prompts, propagation, objects) and the memory bank know nothing of
the model beyond the samfast.video.Tracker protocol, which a family's model implements (SAM 2's:
samfast.sam2.tracker). samfast.build_sam_video builds one for a model type (samfast/build_video.py,
outside this package: the builder imports the families, the families import this package).
"""

from samfast.video.memory_bank import NO_OBJ_SCORE, FrameOutput, MemoryBank
from samfast.video.predictor import InferenceState, ObjectTrack, VideoPredictor
from samfast.video.tracker import Tracker

__all__ = ["NO_OBJ_SCORE", "FrameOutput", "InferenceState", "MemoryBank", "ObjectTrack", "Tracker", "VideoPredictor"]
