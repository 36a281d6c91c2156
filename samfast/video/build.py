"""build_sam_video: a VideoPredictor for a model type, as samfast.build_sam builds a model."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from samfast.errors import StageError
from samfast.sam2.build import build_sam2_model
from samfast.sam2.config import SAM2_MODEL_TYPES, is_sam2_type
from samfast.sam2.video_predictor import VIDEO_FILL_HOLE_AREA, SAM2VideoPredictor, apply_video_postprocessing
from samfast.stages import SWITCHES, parse_stages

# The switches the tracking step is built for so far. bf16: weights in bf16 as for images; the step
# casts what it makes in fp32 (masks into the memory encoder, the pointers' sine encodings) to the
# model's dtype where sam2 leaves that to CUDA autocast. Not yet: compile (the image encoder and
# decoder would compile, but the memory's shapes grow with the video: issue 37's fixed-capacity bank).
VIDEO_SWITCHES = frozenset({"bf16", "sdpa"})
# every stage those switches make, in ladder order: what the video gate runs unless told
VIDEO_STAGES = ("fp32", "fp32+sdpa", "bf16", "bf16+sdpa")


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
    defaults). checkpoint, seed and device as samfast.build_sam takes them; stages: one of
    VIDEO_STAGES so far."""
    if not is_sam2_type(model_type):
        raise ValueError(
            f"{model_type!r} has no memory to track objects with; video tracking takes a SAM 2 type: "
            + ", ".join(SAM2_MODEL_TYPES)
        )
    if unbuilt := sorted(parse_stages(stages) - VIDEO_SWITCHES, key=SWITCHES.index):
        raise StageError(
            f"stages={stages!r}: the {', '.join(unbuilt)} switch(es) are not built for video tracking yet "
            f"(issue 37); build_sam_video takes {', '.join(map(repr, VIDEO_STAGES))}"
        )
    model = build_sam2_model(model_type, checkpoint, seed=seed, device=device, stages=stages)
    apply_video_postprocessing(model)
    return SAM2VideoPredictor(model, fill_hole_area=VIDEO_FILL_HOLE_AREA)
