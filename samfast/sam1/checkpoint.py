"""SAM 1 checkpoints in the official layout: seeded synthetic weights, the model type a state dict
is, and the check that it fits the model asked for."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from samfast.checkpoint import CheckpointError, key_generator, refuse_layout_mismatch, refuse_other_family
from samfast.modeling.common import LayerNorm2d
from samfast.sam1.config import MODEL_CONFIGS, ModelConfig, model_config
from samfast.sam1.sam import build_sam_modules

SAM1_KEY = "image_encoder.patch_embed.proj.weight"  # in every SAM 1 state dict


def synthetic_state_dict(model_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights for `model_type`, in the official layout.

    Every tensor draws from its own CPU generator seeded by (seed, key), so the result is the
    same on every machine and does not depend on key order. Scales follow common ViT inits
    (fan-in for projections, N(0, 1) for learned embeddings, small positional tables) so
    activations stay O(1) through 32 blocks; the rel-pos tables are non-zero so the decomposed
    bias really matters.
    """
    with torch.device("meta"):
        model = build_sam_modules(model_config(model_type))
    persistent = set(model.state_dict())
    state = {}
    for module_name, module in model.named_modules():
        for leaf, tensor in module.named_parameters(recurse=False):
            key = f"{module_name}.{leaf}"
            noise = torch.randn(tensor.shape, generator=key_generator(seed, key))
            if isinstance(module, (nn.LayerNorm, LayerNorm2d)):
                state[key] = 1.0 + 0.02 * noise if leaf == "weight" else 0.02 * noise
            elif isinstance(module, nn.Embedding):
                state[key] = noise
            elif leaf in ("rel_pos_h", "rel_pos_w", "pos_embed"):
                state[key] = 0.05 * noise
            elif leaf == "bias":
                state[key] = 0.02 * noise
            else:  # Linear, Conv2d, ConvTranspose2d weights: keep the output variance near the input's
                in_features = tensor.shape[0] if isinstance(module, nn.ConvTranspose2d) else tensor.shape[1]
                state[key] = noise / (in_features * tensor.shape[2:].numel()) ** 0.5
        for leaf, tensor in module.named_buffers(recurse=False):
            key = f"{module_name}.{leaf}"
            if key in persistent:  # the positional Gaussian; pixel mean/std are not saved
                state[key] = torch.randn(tensor.shape, generator=key_generator(seed, key))
    return state


def infer_model_type(state_dict: Mapping[str, torch.Tensor]) -> tuple[str | None, int, int]:
    """(model type or None, embed dim, depth) read off a checkpoint's encoder."""
    embed_dim = state_dict[SAM1_KEY].shape[0]
    depth = len({k.split(".")[2] for k in state_dict if k.startswith("image_encoder.blocks.")})
    for name, cfg in MODEL_CONFIGS.items():
        if cfg.embed_dim == embed_dim and cfg.depth == depth:
            return name, embed_dim, depth
    return None, embed_dim, depth


def check_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: ModelConfig, expected: Mapping[str, torch.Size]
) -> None:
    """Refuse a state dict of another family or model type, or with missing, unexpected or misshapen keys."""
    refuse_other_family(state_dict, config.name, f"pass a {config.name} checkpoint")
    if SAM1_KEY not in state_dict:
        raise CheckpointError(f"this state dict holds no SAM 1 image encoder (no {SAM1_KEY!r} key); "
                              f"pass a {config.name} checkpoint (or checkpoint=None for seeded synthetic weights).")
    found, embed_dim, depth = infer_model_type(state_dict)
    if (embed_dim, depth) != (config.embed_dim, config.depth):
        what = f"{found} (embed dim {embed_dim})" if found else f"an unknown model type (embed dim {embed_dim}, depth {depth})"
        raise CheckpointError(
            f"this checkpoint is {what}; you asked for {config.name}. "
            f"Call build_sam({(found or '<model type>')!r}, checkpoint=...) or pass a {config.name} checkpoint."
        )
    refuse_layout_mismatch(state_dict, expected, config.name)
