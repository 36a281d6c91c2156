"""The trusted slower path: segment_anything (the reference package) built with samfast's weights."""

from __future__ import annotations

import torch

from samfast.config import model_config


def reference_sam(model_type: str, state_dict: dict[str, torch.Tensor]):
    """segment_anything's Sam of the same shape as samfast's `model_type`, loaded with `state_dict`."""
    from segment_anything.build_sam import _build_sam

    cfg = model_config(model_type)
    sam = _build_sam(
        encoder_embed_dim=cfg.embed_dim,
        encoder_depth=cfg.depth,
        encoder_num_heads=cfg.num_heads,
        encoder_global_attn_indexes=list(cfg.global_attn_indexes),
    )
    sam.load_state_dict(state_dict)
    return sam.eval()
