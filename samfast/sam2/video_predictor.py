"""sam2's build_sam2_video_predictor and SAM2VideoPredictor names, on samfast.VideoPredictor.

sam2's video builder differs from its image builder by two post-processing settings
(apply_postprocessing, the default): the masks of prompted frames are binarized before they are
encoded into memory, and holes up to 8 pixels in the low-res masks are filled (which, without
sam2's CUDA extension and so always in samfast, is skipped with a warning).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from samfast.sam2.build import build_sam2
from samfast.sam2.sam2_base import SAM2Base
from samfast.stages import compile_mode
from samfast.video.predictor import VideoPredictor

VIDEO_FILL_HOLE_AREA = 8  # build_sam2_video_predictor's ++model.fill_hole_area


class SAM2VideoPredictor(VideoPredictor):
    """samfast.VideoPredictor under sam2's class name (sam2's is a subclass of the model; this one holds it)."""


def apply_video_postprocessing(model: SAM2Base) -> None:
    """build_sam2_video_predictor's apply_postprocessing on the model: prompted frames' masks
    binarized before the memory encoder (the fill_hole_area half is the predictor's)."""
    model.tracking = dataclasses.replace(model.tracking, binarize_mask_from_pts_for_mem_enc=True)


def build_sam2_video_predictor(
    config_file: str,
    ckpt_path: str | Path | None = None,
    device: str | torch.device = "cuda",
    mode: str = "eval",
    hydra_overrides_extra: list[str] | None = None,
    apply_postprocessing: bool = True,
    vos_optimized: bool = False,
    *,
    seed: int = 0,
    **predictor_options,
) -> SAM2VideoPredictor:
    """sam2.build_sam.build_sam2_video_predictor without hydra: config_file one of sam2's config
    names (as samfast.sam2.build_sam2 takes them), ckpt_path an official checkpoint or None for
    samfast's seeded weights.

    predictor_options: VideoPredictor's (fill_hole_area, non_overlap_masks,
    clear_non_cond_mem_around_input, add_all_frames_to_correct_as_cond), which sam2 sets through
    hydra overrides. vos_optimized (sam2 compiles every component) is not built: use
    samfast.build_sam_video(model_type, stages="...compile...").
    """
    if vos_optimized:
        raise NotImplementedError(
            "vos_optimized is not built in samfast; for a compiled tracker use "
            "samfast.build_sam_video(model_type, checkpoint, stages='compile')"
        )
    model = build_sam2(
        config_file,
        ckpt_path,
        device=device,
        mode=mode,
        hydra_overrides_extra=hydra_overrides_extra,
        apply_postprocessing=apply_postprocessing,
        seed=seed,
    )
    if apply_postprocessing:
        apply_video_postprocessing(model)
        predictor_options.setdefault("fill_hole_area", VIDEO_FILL_HOLE_AREA)
    return SAM2VideoPredictor(model, **predictor_options)


def compile_tracking(model: SAM2Base) -> None:
    """The compile switch's tracking half, which samfast.build_sam_video adds to build_sam2_model's
    compiled image encoder and decoder: the memory read at its fixed capacity, so that neither the memory attention nor the memory encoder
    recompiles as the video grows, and the heads of a frame tracked without prompts (prompt encoder,
    decoder, object pointer) as one graph. Each compiles (fullgraph) a static graph for one object and one
    graph for every larger batch of objects (samfast.sam2.memory.static_graphs), the attention one per number
    of conditioning frames too. Mode: SAMFAST_COMPILE_MODE,
    else max-autotune on a GPU and inductor's default on a CPU, as for images."""
    model.fixed_capacity_memory = True
    if "bf16" in model.switches:
        # the epilogue GEMMs and the channels-last depthwise conv: within bf16's rounding, not fp32's
        # (the GELU epilogue is the tanh form), as for the image encoder's MLPs
        for layer in model.memory_attention.layers:
            layer.relu_impl = "epilogue"
        model.memory_encoder.channels_last = True
        for block in model.memory_encoder.fuser.layers:
            block.channels_last, block.gelu_impl = True, "epilogue"
    mode = compile_mode(model.device)
    model.memory_attention.compile_static(mode)
    model.memory_encoder.compile_static(mode)
    model.compile_propagation_heads(mode)
