"""Building ready-to-run SAM 2 models: samfast.build_sam's SAM 2 branch, and sam2's build_sam2 signature."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from samfast.checkpoint import read_checkpoint
from samfast.errors import StageError
from samfast.sam2.checkpoint import (
    check_sam2_state_dict,
    synthetic_state_dict,
    unwrap_state_dict,
)
from samfast.sam2.config import model_type_of_config_file, sam2_config
from samfast.sam2.sam2_base import SAM2Base, build_sam2_modules
from samfast.stages import SWITCHES, apply_stages, parse_stages

# the switches built for SAM 2 so far: the lossless ones (triton: the decoder's Triton kernels, Hiera
# having no rel-pos attention for it; nt: predict_batch decodes every image's prompts in one call), and
# int8 / fp8 on Hiera's linears (the encoder_linears the model names); sparse is not
SAM2_SWITCHES = frozenset({"bf16", "compile", "sdpa", "triton", "nt", "int8", "fp8"})


def refuse_unbuilt_switches(model_type: str, stages: str) -> None:
    """StageError naming the switches of `stages` not built for SAM 2 and the stage to ask for instead."""
    switches = parse_stages(stages)
    if unbuilt := sorted(switches - SAM2_SWITCHES, key=SWITCHES.index):
        built = sorted(switches & SAM2_SWITCHES, key=SWITCHES.index)
        # one name alone is a rung of SAM 1's cumulative ladder: "fp32+" keeps it exactly that switch
        instead = "+".join(built) if len(built) > 1 else "+".join(["fp32", *built])
        raise StageError(
            f"stages={stages!r}: the {', '.join(unbuilt)} switch(es) are not built for SAM 2 yet; "
            f"{model_type} takes fp32 and any combination of {', '.join(sorted(SAM2_SWITCHES, key=SWITCHES.index))}: "
            f"use {instead!r} for the built part of this stage"
        )


def build_sam2_model(
    model_type: str,
    checkpoint: str | Path | Mapping | None = None,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    stages: str = "fp32",
    batch_size: int = 8,
    dynamic_multimask_via_stability: bool = True,
) -> SAM2Base:
    """What samfast.build_sam does for a SAM 2 model type: a ready-to-run SAM2Base in eval mode.

    checkpoint: the path of an official file ({"model": state_dict}, e.g. sam2.1_hiera_tiny.pt),
    such a dict or a bare state dict, or None for `synthetic_state_dict(model_type, seed)`.
    stages: SAM 1's grammar (samfast.stages); SAM 2 takes the switches in SAM2_SWITCHES so far.
    batch_size: with the compile switch the encoder always runs batches of exactly this size.
    """
    config = sam2_config(model_type)
    switches = parse_stages(stages)
    refuse_unbuilt_switches(model_type, stages)
    model = build_sam2_modules(config, dynamic_multimask_via_stability)
    if checkpoint is None:
        state = synthetic_state_dict(model_type, seed)
    elif isinstance(checkpoint, Mapping):
        state = unwrap_state_dict(checkpoint)
    else:
        state = read_checkpoint(checkpoint, model_type)  # unwraps {"model": ...} too; "trained": model_type's file
    check_sam2_state_dict(state, config, {k: v.shape for k, v in model.state_dict().items()})
    model.load_state_dict(state)
    model.eval().requires_grad_(False)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.static_batch = batch_size if "compile" in switches else None
    apply_stages(model, switches)
    return model


def build_sam2(
    config_file: str,
    ckpt_path: str | Path | None = None,
    device: str | torch.device = "cuda",
    mode: str = "eval",
    hydra_overrides_extra: list[str] | None = None,
    apply_postprocessing: bool = True,
    *,
    seed: int = 0,
) -> SAM2Base:
    """sam2.build_sam.build_sam2 without hydra: config_file is one of sam2's config names
    ("configs/sam2.1/sam2.1_hiera_t.yaml", "sam2.1_hiera_t.yaml", ...); ckpt_path an official
    checkpoint, or None for samfast's seeded synthetic weights (where sam2 keeps its random init).

    apply_postprocessing (sam2's default) makes a single requested mask fall back to the best of
    three when it is unstable, as sam2 does. Hydra overrides are not supported.
    """
    if hydra_overrides_extra:
        raise ValueError(f"samfast builds SAM 2 without hydra; overrides {hydra_overrides_extra} are not supported")
    if mode not in ("eval", "train"):
        raise ValueError(f"mode must be 'eval' or 'train', not {mode!r}")
    model = build_sam2_model(
        model_type_of_config_file(config_file),
        ckpt_path,
        seed=seed,
        device=device,
        dynamic_multimask_via_stability=apply_postprocessing,
    )
    if mode == "train":
        model.train().requires_grad_(True)
    return model
