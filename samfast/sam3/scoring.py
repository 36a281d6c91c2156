"""SAM 3's query scores: each decoder state's dot product with the mean of the prompt tokens.

sam3.model.model_misc.DotProductScoring as sam3.model_builder builds it (a residual, layer-normed
MLP on the prompt first; logits clamped to +-12); parameters under sam3's names.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from samfast.modeling.mask_decoder import MLP


class ResidualNormedMLP(MLP):
    """out_norm(x + MLP(x)): sam3's MLP with residual=True and an out_norm (the `prompt_mlp`)."""

    def __init__(self, dim: int, hidden_dim: int, num_layers: int) -> None:
        super().__init__(dim, hidden_dim, dim, num_layers)
        self.out_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_norm(super().forward(x) + x)


def masked_token_mean(tokens: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """(S, B, C) tokens, (B, S) padding mask (True: padding) -> (B, C), the mean of the valid tokens
    (zeros for a prompt with none)."""
    is_valid = (~padding_mask).to(tokens.dtype).transpose(0, 1)[..., None]
    count = is_valid.sum(dim=0).clamp(min=1.0)
    return (tokens * is_valid).sum(dim=0) / count


class DotProductScoring(nn.Module):
    def __init__(self, d_model: int = 256, d_proj: int = 256, mlp_dim: int = 2048, clamp_max_val: float = 12.0) -> None:
        super().__init__()
        self.prompt_mlp = ResidualNormedMLP(d_model, mlp_dim, num_layers=2)
        self.prompt_proj = nn.Linear(d_model, d_proj)
        self.hs_proj = nn.Linear(d_model, d_proj)
        self.scale = 1.0 / math.sqrt(d_proj)
        self.clamp_max_val = clamp_max_val

    def forward(self, hs: torch.Tensor, prompt: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """hs (layers, B, Q, C) the decoder states batch-first (as Sam3Image passes them), prompt (S, B, C),
        prompt_mask (B, S) True on padding -> logits (layers, B, Q, 1)."""
        pooled = self.prompt_proj(masked_token_mean(self.prompt_mlp(prompt), prompt_mask))
        scores = self.hs_proj(hs) @ pooled[..., None] * self.scale
        return scores.clamp(min=-self.clamp_max_val, max=self.clamp_max_val)
