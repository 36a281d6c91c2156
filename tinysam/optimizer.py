"""AdamW with weight decay on matrices and kernels only, and its warmup-then-cosine learning rate."""

from __future__ import annotations

import math

import torch


def make_optimizer(model, lr: float, weight_decay: float) -> torch.optim.AdamW:
    fused = {"fused": True} if model.device.type == "cuda" else {}
    return torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.999), **fused)


def _param_groups(model, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and kernels only: not on norms, biases, embeddings or positional tables
    (SAM 2's no_mem_embed, a bare parameter, included). Frozen parameters are left out."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = param.ndim < 2 or "pos" in name.split(".")[-1] or ".point_embeddings." in name \
            or name.endswith(("_token.weight", "_tokens.weight", "_embed.weight", "_embed"))
        (plain if no_decay else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def fade_in_weight(step: int, total: int, fraction: float) -> float:
    """0 at step 0, rising linearly to 1 at fraction x total steps, then 1 (1 throughout when fraction is 0)."""
    return 1.0 if fraction <= 0 else min(1.0, step / (fraction * total))


def learning_rate(step: int, total: int, warmup: int, base: float, final_ratio: float = 0.01) -> float:
    """Linear warmup over `warmup` steps, then cosine from base down to base * final_ratio at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
