"""The three ways samfast computes attention, chosen per module by the `attn_impl` switch.

"math" is the reference's explicit softmax(q k^T) v; "sdpa" goes through
F.scaled_dot_product_attention (the bias, where there is one, as a materialized mask);
"triton" (encoder only) fuses SAM's decomposed rel-pos bias into a flash-attention kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTN_IMPLS = ("math", "sdpa", "triton")


def decomposed_bias(rel_h: torch.Tensor, rel_w: torch.Tensor) -> torch.Tensor:
    """Materialize bias[..., i, kh*kw] = rel_h[..., i, j // kw] + rel_w[..., i, j % kw]."""
    *lead, length, kh = rel_h.shape
    kw = rel_w.shape[-1]
    return (rel_h[..., :, None] + rel_w[..., None, :]).reshape(*lead, length, kh * kw)


def attention_with_relpos(
    qkv: torch.Tensor,
    rel_h: torch.Tensor | None,
    rel_w: torch.Tensor | None,
    scale: float,
    impl: str,
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v for q, k, v stacked as qkv (3, B, H, L, D); bias from rel_h/rel_w or none."""
    if impl == "triton" and rel_h is not None:
        from samfast.kernels import relpos_attention

        return relpos_attention(qkv, rel_h, rel_w, scale=scale)
    q, k, v = qkv.unbind(0)
    return attention(q, k, v, scale, impl, None if rel_h is None else decomposed_bias(rel_h, rel_w))


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, impl: str, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v for (B, H, L, D) q, k, v, written out ("math") or through SDPA."""
    if impl == "math":
        # Same operation order as segment_anything, so the fp32 stage equals it to rounding.
        attn = (q * scale) @ k.transpose(-2, -1)
        if bias is not None:
            attn = attn + bias
        return attn.softmax(dim=-1) @ v
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
