"""samfast: Segment Anything rewritten for speed in native PyTorch, one switch per optimization."""

__version__ = "0.1.0"

from samfast import sam1, sam2, sam3  # the families: each registers its record in samfast.families
from samfast.amg import SamAutomaticMaskGenerator
from samfast.build import build_sam, synthetic_state_dict
from samfast.checkpoint import CheckpointError
from samfast.sam1.config import MODEL_TYPES
from samfast.predictor import Prediction, Prompts, SamPredictor
from samfast.sam2.config import SAM2_MODEL_TYPES
from samfast.errors import StageError
from samfast.stages import LADDER
from samfast.transforms import InputError
from samfast.video import VideoPredictor
from samfast.build_video import build_sam_video

__all__ = [
    "LADDER",
    "MODEL_TYPES",
    "CheckpointError",
    "InputError",
    "Prediction",
    "Prompts",
    "SAM2_MODEL_TYPES",
    "SamAutomaticMaskGenerator",
    "SamPredictor",
    "StageError",
    "VideoPredictor",
    "build_sam",
    "build_sam_video",
    "synthetic_state_dict",
]
