"""build_sam_video: a VideoPredictor for a model type, as samfast.build_sam builds a model."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from samfast.sam2.build import build_sam2_model
from samfast.sam2.config import SAM2_MODEL_TYPES, is_sam2_type
from samfast.sam2.video_predictor import VIDEO_FILL_HOLE_AREA, SAM2VideoPredictor, apply_video_postprocessing


def build_sam_video(
    model_type: str,
    checkpoint: str | Path | Mapping | None = None,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    stages: str = "fp32",
) -> SAM2VideoPredictor:
    """A video predictor (init_state, add_new_points_or_box, propagate_in_video, ...) of a model
    type with memory (the SAM 2 types), with sam2's video settings (build_sam2_video_predictor's
    defaults). checkpoint, seed, device and stages as samfast.build_sam takes them."""
    if not is_sam2_type(model_type):
        raise ValueError(
            f"{model_type!r} has no memory to track objects with; video tracking takes a SAM 2 type: "
            + ", ".join(SAM2_MODEL_TYPES)
        )
    model = build_sam2_model(model_type, checkpoint, seed=seed, device=device, stages=stages)
    apply_video_postprocessing(model)
    return SAM2VideoPredictor(model, fill_hole_area=VIDEO_FILL_HOLE_AREA)
