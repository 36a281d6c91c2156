"""Video object tracking for trackers of SAM 2's design: samfast.VideoPredictor and its memory bank.

Family-neutral: the predictor (prompts, propagation, objects) and the memory bank know nothing of
the model beyond its tracking step (samfast.sam2.tracker for SAM 2). samfast.build_sam_video
builds one for a model type (samfast/video/build.py, kept out of this package's import so the
tracker can import the bank).
"""

from samfast.video.memory_bank import NO_OBJ_SCORE, FrameOutput, MemoryBank
from samfast.video.predictor import InferenceState, ObjectTrack, VideoPredictor

__all__ = ["NO_OBJ_SCORE", "FrameOutput", "InferenceState", "MemoryBank", "ObjectTrack", "VideoPredictor"]
