"""SAM 2 checkpoints in the official layout: seeded synthetic weights, and checks with clear errors."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from samfast.checkpoint import CheckpointError, key_generator, refuse_layout_mismatch, refuse_other_family
from samfast.modeling.common import LayerNorm2d
from samfast.sam2.config import (
    SIZE_NAMES,
    TRUNK_KEY,
    Sam2Config,
    infer_sam2_model_type,
    sam2_config,
)
from samfast.sam2.sam2_base import build_sam2_modules

def synthetic_state_dict(model_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights for a SAM 2 model type, in the official layout.

    As samfast.sam1.checkpoint.synthetic_state_dict does for SAM 1: every tensor from its own generator
    seeded by (seed, key); fan-in scales for projections so activations stay O(1) through the
    trunk; N(0, 1) learned token embeddings; small positional tables and memory embeddings
    (sam2 initializes those with std 0.02); non-zero so that every parameter really matters.
    """
    with torch.device("meta"):
        model = build_sam2_modules(sam2_config(model_type))
    state = {}
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for leaf, tensor in module.named_parameters(recurse=False):
            key = prefix + leaf
            noise = torch.randn(tensor.shape, generator=key_generator(seed, key))
            if isinstance(module, (nn.LayerNorm, LayerNorm2d)):
                state[key] = 1.0 + 0.02 * noise if leaf == "weight" else 0.02 * noise
            elif isinstance(module, nn.Embedding):
                state[key] = noise
            elif leaf == "bias":
                state[key] = 0.02 * noise
            elif tensor.ndim >= 2 and isinstance(module, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
                in_features = tensor.shape[0] if isinstance(module, nn.ConvTranspose2d) else tensor.shape[1]
                state[key] = noise / (in_features * tensor.shape[2:].numel()) ** 0.5
            elif leaf == "gamma":  # ConvNeXt layer scale: small, so each block stays near its residual
                state[key] = 0.1 + 0.02 * noise
            else:  # positional tables, memory and no-object embeddings
                state[key] = 0.05 * noise
        for leaf, tensor in module.named_buffers(recurse=False):
            key = prefix + leaf  # the prompt encoder's positional Gaussian, the one saved buffer
            state[key] = torch.randn(tensor.shape, generator=key_generator(seed, key))
    return state


def _official_name(model_type: str) -> str:
    """sam2.1_hiera_b+ -> sam2.1_hiera_base_plus.pt, the name of the official file (the project's own
    sizes have none: their checkpoint is the one samfast/weights ships or one trained by tinysam)."""
    family, size = model_type.rsplit("_", 1)
    return f"{family}_{SIZE_NAMES[size]}.pt" if size in SIZE_NAMES else f"a {model_type} checkpoint"


def check_sam2_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: Sam2Config, expected: Mapping[str, torch.Size]
) -> None:
    """Refuse a state dict of another family, one of another SAM 2 type, or one with missing, unexpected or misshapen keys."""
    want = f"pass {_official_name(config.name)} (or checkpoint=None for seeded synthetic weights)"
    refuse_other_family(state_dict, config.name, want)
    if TRUNK_KEY not in state_dict:
        raise CheckpointError(f"this state dict holds no SAM 2 image encoder (no {TRUNK_KEY!r} key); {want}.")
    found, embed_dim, depth = infer_sam2_model_type(state_dict)
    if found != config.name:
        what = found or f"an unknown SAM 2 model (trunk embed dim {embed_dim}, {depth} blocks)"
        fix = f"Call build_sam({found!r}, checkpoint=...) or {want}." if found else f"{want[0].upper()}{want[1:]}."
        raise CheckpointError(f"this checkpoint is {what}; you asked for {config.name}. {fix}")
    refuse_layout_mismatch(state_dict, expected, config.name)
