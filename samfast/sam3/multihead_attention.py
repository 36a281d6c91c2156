"""nn.MultiheadAttention's parameters (packed in_proj_weight / in_proj_bias, out_proj) on samfast's attention.

sam3 builds its detector's attentions from torch's nn.MultiheadAttention, seq-first or batch-first;
this module holds the same parameters under the same names, so sam3's state dict loads into it
strictly, and runs batch-first (B, L, C) through samfast.modeling.attention (SDPA by default).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast.modeling.attention import attention


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}: pick a head count that divides it"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.attn_impl = "sdpa"

    def _heads(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """The index-th of the q, k, v projections of x (B, L, C), split into heads: (B, H, L, C / H)."""
        dim = self.embed_dim
        rows = slice(index * dim, (index + 1) * dim)
        x = F.linear(x, self.in_proj_weight[rows], self.in_proj_bias[rows])
        return x.unflatten(-1, (self.num_heads, dim // self.num_heads)).transpose(1, 2)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention of q (B, Lq, C) over k, v (B, Lk, C); bias: additive, broadcastable to (B, H, Lq, Lk)."""
        q, k, v = self._heads(q, 0), self._heads(k, 1), self._heads(v, 2)
        out = attention(q, k, v, (self.embed_dim // self.num_heads) ** -0.5, self.attn_impl, bias)
        return self.out_proj(out.transpose(1, 2).flatten(2))


def padding_bias(key_padding_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Lk) key padding mask (True: padding, nn.MultiheadAttention's convention) as an additive
    bias (B, 1, 1, Lk): -inf on padding keys, 0 elsewhere."""
    bias = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
    return bias.masked_fill(key_padding_mask, float("-inf"))[:, None, None, :]


def seq_first(attn: MultiheadAttention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """`attn` over sequence-first (L, B, C) tensors, the layout sam3's nn.MultiheadAttention modules take."""
    bias = None if key_padding_mask is None else padding_bias(key_padding_mask, query.dtype)
    return attn(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), bias).transpose(0, 1)
