"""build_sam_video: a VideoPredictor for a model type, as samfast.build_sam builds a model.

Beside samfast/build.py, above both samfast.video (the predictor, family-neutral) and the family that
supplies the tracker, so that neither imports the other's builder."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from samfast.errors import StageError
from samfast.families import families_supporting, family_of
from samfast.sam2.build import build_sam2_model
from samfast.sam2.video_predictor import (
    VIDEO_FILL_HOLE_AREA,
    SAM2VideoPredictor,
    apply_video_postprocessing,
    compile_tracking,
)
from samfast.stages import SWITCHES, parse_stages

# The switches the tracking step is built for so far. bf16: weights in bf16 as for images; the step
# casts what it makes in fp32 (masks into the memory encoder, the pointers' sine encodings) to the
# model's dtype where sam2 leaves that to CUDA autocast. compile: the image encoder (a static batch
# of frames_per_encode frames a call) and the decoder as for images, plus the memory attention, the
# memory encoder and a propagated frame's heads with static shapes (sam2.video_predictor.compile_tracking): the memory read
# at its fixed capacity, padded and masked. sdpa: as for images, plus the memory cross-attention split
# at its memory frames, each attended unmasked, its values at the memory's 64 channels
# on a GPU (samfast.sam2.memory.attention; set by samfast.stages for every SAM 2 model, run only by tracking).
# triton: as for images (Hiera's small windows, the decoder's upscaling; its cross attentions only for
# calls of MIN_FUSED_PROMPTS prompts and more, samfast.modeling.sam2_prompting.mask_decoder, so not a tracked frame's few),
# plus the memory cross-attention's keys projected and rotated in one kernel (kernels.rotated_keys).
VIDEO_SWITCHES = frozenset({"bf16", "compile", "sdpa", "triton"})
# the stages the video gate runs unless told, from the baseline up: each switch alone on fp32, then
# stacked on bf16 (on a CPU the gate leaves the compiled ones out: parity.tasks.video.runner.default_stages)
VIDEO_STAGES = ("fp32", "fp32+sdpa", "bf16", "bf16+sdpa", "fp32+compile", "bf16+compile+sdpa",
                "bf16+compile+sdpa+triton")


def build_sam_video(
    model_type: str,
    checkpoint: str | Path | Mapping | None = None,
    *,
    seed: int | None = None,
    device: str | torch.device | None = None,
    stages: str = "fp32",
    frames_per_encode: int = 1,
) -> SAM2VideoPredictor:
    """A video predictor (init_state, add_new_points_or_box, propagate_in_video, ...) of a model
    type with memory (the SAM 2 types), with sam2's video settings (build_sam2_video_predictor's
    defaults). checkpoint, seed and device as samfast.build_sam takes them; stages: fp32 or any
    combination of VIDEO_SWITCHES (VIDEO_STAGES lists the gate's). frames_per_encode: the frames
    ahead of tracking the image encoder takes in one call (VideoPredictor; 1 as sam2; with the
    compile switch every encoder call has that batch, the last of a video zero-padded)."""
    if not family_of(model_type).supports("video"):
        raise ValueError(
            f"{model_type!r} has no memory to track objects with; video tracking takes a model type of "
            + "; ".join(f"{f.name}: {', '.join(f.model_types)}" for f in families_supporting("video"))
        )
    if unbuilt := sorted(parse_stages(stages) - VIDEO_SWITCHES, key=SWITCHES.index):
        raise StageError(
            f"stages={stages!r}: the {', '.join(unbuilt)} switch(es) are not built for video tracking yet"
            f"; build_sam_video takes {', '.join(map(repr, VIDEO_STAGES))}"
        )
    # the image encoder's static batch under the compile switch: the frames it takes in one call
    model = build_sam2_model(model_type, checkpoint, seed=seed, device=device, stages=stages,
                             batch_size=frames_per_encode)
    if "compile" in parse_stages(stages):
        compile_tracking(model)
    apply_video_postprocessing(model)
    return SAM2VideoPredictor(model, fill_hole_area=VIDEO_FILL_HOLE_AREA, frames_per_encode=frames_per_encode)
