"""2-D axial rotary position encoding of the memory attention (sam2.modeling.position_encoding)."""

from __future__ import annotations

import torch


def compute_axial_cis(dim: int, end_x: int, end_y: int, theta: float = 10000.0) -> torch.Tensor:
    """(end_x * end_y, dim // 2) complex rotations: the first half of each row by x, the second by y."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4)[: (dim // 4)].float() / dim))
    t = torch.arange(end_x * end_y, dtype=torch.float32)
    t_x, t_y = (t % end_x).float(), torch.div(t, end_x, rounding_mode="floor").float()
    freqs_x, freqs_y = torch.outer(t_x, freqs), torch.outer(t_y, freqs)
    cis_x = torch.polar(torch.ones_like(freqs_x), freqs_x)
    cis_y = torch.polar(torch.ones_like(freqs_y), freqs_y)
    return torch.cat([cis_x, cis_y], dim=-1)


def apply_rotary_enc(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor, repeat_freqs_k: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate (B, heads, L, D) queries and keys; with repeat_freqs_k the keys are several
    memory frames of L tokens each, every frame rotated like the queries."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    freqs = freqs_cis.view(*([1] * (xq_.ndim - 2)), *freqs_cis.shape)
    xq_out = torch.view_as_real(xq_ * freqs).flatten(3).type_as(xq)
    if xk.shape[-2] == 0:  # no keys to rotate
        return xq_out, xk
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    if repeat_freqs_k:
        r = xk_.shape[-2] // xq_.shape[-2]
        freqs = freqs.unsqueeze(2).expand(-1, -1, r, -1, -1).flatten(2, 3)
    xk_out = torch.view_as_real(xk_ * freqs).flatten(3).type_as(xk)
    return xq_out, xk_out
