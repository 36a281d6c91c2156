"""nn.MultiheadAttention as SAM 3 runs it: sequence first, no attention weights returned, inference only.

sam3 builds its attentions as nn.MultiheadAttention (through its MultiheadAttentionWrapper, which never
asks for the weights); with need_weights=False torch computes them through
F.scaled_dot_product_attention, and so does this module. The parameters keep torch's names and shapes
(q, k, v projections packed in in_proj_weight / in_proj_bias, then out_proj), so sam3's state dicts load
into it unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}: pick widths that divide")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # torch's initialization, so that a module built here and never loaded is still usable
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """query (L, B, E), key and value (S, B, E), key_padding_mask (B, S) True where a key is padding -> (L, B, E)."""
        q, k, v = self._project(query, key, value)
        mask = None
        if key_padding_mask is not None:
            # additive, as torch turns a boolean key padding mask before it calls SDPA
            mask = torch.zeros(key_padding_mask.shape, dtype=q.dtype, device=q.device)
            mask = mask.masked_fill(key_padding_mask, float("-inf"))[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        length, batch = query.shape[:2]
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(length, batch, self.embed_dim))

    def _project(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v as (B, heads, length, head_dim); self-attention (one tensor for all three) as one GEMM."""
        if query is key and key is value:
            q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        else:
            weights, biases = self.in_proj_weight.chunk(3), self.in_proj_bias.chunk(3)
            q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))
        return tuple(self._split_heads(x) for x in (q, k, v))

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        length, batch = x.shape[:2]
        return x.reshape(length, batch, self.num_heads, -1).permute(1, 2, 0, 3)
