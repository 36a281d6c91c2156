"""Building ready-to-run SAM 2 models: samfast.build_sam with sam2's option, and sam2's build_sam2 signature."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from samfast.build import build_sam
from samfast.sam2.config import model_type_of_config_file, sam2_config
from samfast.sam2.sam2_base import SAM2Base


def build_sam2_model(
    model_type: str,
    checkpoint: str | Path | Mapping | None = None,
    *,
    seed: int | None = None,
    device: str | torch.device | None = None,
    stages: str = "fp32",
    batch_size: int = 8,
    dynamic_multimask_via_stability: bool = True,
) -> SAM2Base:
    """samfast.build_sam for a SAM 2 model type (a ValueError for another family's): a ready-to-run
    SAM2Base in eval mode, with sam2's build_sam2 option of a single mask's fallback to the best of three.

    checkpoint: the path of an official file ({"model": state_dict}, e.g. sam2.1_hiera_tiny.pt),
    such a dict or a bare state dict, or None for `synthetic_state_dict(model_type, seed)`.
    stages: SAM 1's grammar (samfast.stages); SAM 2 takes the switches in samfast.sam2.family.SAM2_SWITCHES so far.
    batch_size: with the compile switch the encoder always runs batches of exactly this size.
    """
    sam2_config(model_type)
    return build_sam(model_type, checkpoint, seed=seed, device=device, stages=stages, batch_size=batch_size,
                     dynamic_multimask_via_stability=dynamic_multimask_via_stability)


def build_sam2(
    config_file: str,
    ckpt_path: str | Path | None = None,
    device: str | torch.device = "cuda",
    mode: str = "eval",
    hydra_overrides_extra: list[str] | None = None,
    apply_postprocessing: bool = True,
    *,
    seed: int | None = None,
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
