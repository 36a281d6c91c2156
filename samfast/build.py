"""build_sam: a Sam of a model type, from an official checkpoint or seeded synthetic weights, at a ladder stage."""

from __future__ import annotations

from pathlib import Path

import torch

from samfast.checkpoint import check_state_dict, read_checkpoint
from samfast.checkpoint import synthetic_state_dict as sam1_synthetic_state_dict
from samfast.config import model_config
from samfast.modeling.sam import Sam, build_sam_modules
from samfast.sam2.build import SAM2_SWITCHES, build_sam2_model, refuse_unbuilt_switches
from samfast.sam2.checkpoint import synthetic_state_dict as sam2_synthetic_state_dict
from samfast.sam2.config import is_sam2_type
from samfast.sam2.sam2_base import SAM2Base
from samfast.stages import SWITCHES, apply_stages, parse_stages


def build_sam(
    model_type: str,
    checkpoint: str | Path | None = None,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    stages: str = "fp32",
    batch_size: int = 8,
) -> Sam | SAM2Base:
    """A ready-to-run Sam (SAM2Base for a SAM 2 model type, see samfast.sam2) in eval mode.

    checkpoint: path of an official sam_vit_*.pth (or any state dict in that layout), or for SAM 2
    an official sam2*_hiera_*.pt or its {"model": state_dict}; None for
    `synthetic_state_dict(model_type, seed)`. stages: a ladder name or switches joined by '+'
    (see samfast.LADDER). batch_size: with the compile switch the encoder always runs batches
    of exactly this size (smaller ones padded, larger ones split), so it never recompiles.
    """
    if is_sam2_type(model_type):  # the SAM 2 family lives in samfast.sam2
        return build_sam2_model(model_type, checkpoint, seed=seed, device=device, stages=stages, batch_size=batch_size)
    config = model_config(model_type)
    switches = parse_stages(stages)
    model = build_sam_modules(config)
    state = synthetic_state_dict(model_type, seed) if checkpoint is None else read_checkpoint(checkpoint, model_type)
    check_state_dict(state, config, {k: v.shape for k, v in model.state_dict().items()})
    model.load_state_dict(state)
    model.eval().requires_grad_(False)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.static_batch = batch_size if "compile" in switches else None
    apply_stages(model, switches)
    return model


def synthetic_state_dict(model_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded synthetic weights for any model type, SAM 1 or SAM 2, in its official state-dict layout."""
    return (sam2_synthetic_state_dict if is_sam2_type(model_type) else sam1_synthetic_state_dict)(model_type, seed)


def built_switches(model_type: str) -> frozenset[str]:
    """The switches `build_sam(model_type, stages=...)` takes: all of them for SAM 1, fewer for SAM 2 so far."""
    return SAM2_SWITCHES if is_sam2_type(model_type) else frozenset(SWITCHES)


def check_stages(model_type: str, stages: str) -> None:
    """StageError, before any model is built, for a stage `build_sam(model_type, stages=...)` would refuse."""
    parse_stages(stages)
    if is_sam2_type(model_type):
        refuse_unbuilt_switches(model_type, stages)
