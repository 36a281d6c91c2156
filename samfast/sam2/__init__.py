"""The SAM 2 family (SAM 2.1 and 2.0 image and video models), under sam2's own names and signatures.

Code written for the `sam2` package runs by changing the import:

    from samfast.sam2 import build_sam2, SAM2ImagePredictor, SAM2AutomaticMaskGenerator
    model = build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", "sam2.1_hiera_tiny.pt", device="cuda")

samfast.build_sam("sam2.1_hiera_t", ...) builds the same model. Laid out like sam2: backbones/
(Hiera trunk, FPN neck), memory/ (the video memory), the prompt encoder, mask decoder and image predictor
shared with SAM 3 in samfast/modeling/sam2_prompting/,
tracker.py (the tracking step), family.py (its record in samfast.families). build_sam2_video_predictor gives samfast.VideoPredictor
(samfast/video/) with sam2's video settings, as SAM2VideoPredictor.
"""

from samfast.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator
from samfast.sam2.build import build_sam2
from samfast.sam2.config import SAM2_MODEL_TYPES
from samfast.sam2.family import SAM2
from samfast.modeling.sam2_prompting.image_predictor import SAM2ImagePredictor
from samfast.sam2.predictor import SamPredictorForSAM2
from samfast.sam2.sam2_base import SAM2Base
from samfast.sam2.video_predictor import SAM2VideoPredictor, build_sam2_video_predictor

__all__ = [
    "SAM2",
    "SAM2_MODEL_TYPES",
    "SAM2AutomaticMaskGenerator",
    "SAM2Base",
    "SAM2ImagePredictor",
    "SAM2VideoPredictor",
    "SamPredictorForSAM2",
    "build_sam2",
    "build_sam2_video_predictor",
]
