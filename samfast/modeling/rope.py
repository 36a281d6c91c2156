"""2-D axial rotary position encoding of SAM 2's memory attention (sam2.modeling.position_encoding) and
SAM 3's ViT (sam3.model.vitdet), which share the same rotations.

sam2 keeps the rotations as complex numbers and rotates through torch.view_as_complex; inductor has
no complex code generation, so inside the compiled memory attention those multiplications ran as
separate eager kernels (docs/history/sam2-video-speed.md). Here a
rotation is its (cos, sin) pair and the multiplication is written out in real arithmetic, which
inductor fuses with its neighbours; on the CPU it gives sam2's bits (tests/unit/test_sam2_video.py
holds the tracker equal to sam2's, tests/unit/test_rope.py this module to its complex form).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def axial_rotations(dim: int, end_x: int, end_y: int, theta: float = 10000.0) -> torch.Tensor:
    """sam2's compute_axial_cis as the (2, end_x * end_y, dim) float32 table rotate reads: row 0 each
    rotation's cosine twice (for the pair's re and im), row 1 its sine as (-sin, sin); the first half of
    each token's rotations by x, the second by y. Made whole here, outside the compiled graph, so that the
    kernels rotating the memory keys load one value of each (they built the pairs per element: 4 masked loads)."""
    return rotations_of(axial_cis(dim, end_x, end_y, theta))


def axial_cis(dim: int, end_x: int, end_y: int, theta: float = 10000.0, scale: float = 1.0) -> torch.Tensor:
    """The (end_x * end_y, dim / 2) complex rotations of sam2's and sam3's compute_axial_cis, in their
    operation order: token positions (x, y) times `scale` (sam3's ViT interpolates its RoPE from the
    24 x 24 grid it was trained on by scaling positions; 1.0 elsewhere, which leaves the positions' bits)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4)[: (dim // 4)].float() / dim))
    t = torch.arange(end_x * end_y, dtype=torch.float32)
    t_x, t_y = (t % end_x).float() * scale, torch.div(t, end_x, rounding_mode="floor").float() * scale
    freqs_x, freqs_y = torch.outer(t_x, freqs), torch.outer(t_y, freqs)
    cis_x = torch.polar(torch.ones_like(freqs_x), freqs_x)
    cis_y = torch.polar(torch.ones_like(freqs_y), freqs_y)
    return torch.cat([cis_x, cis_y], dim=-1)


def rotations_of(cis: torch.Tensor) -> torch.Tensor:
    """The (2, L, 2 * P) real table (axial_rotations' layout) of (L, P) complex rotations."""
    cos, sin = cis.real, cis.imag
    return torch.stack([torch.stack([cos, cos], dim=-1).flatten(-2), torch.stack([-sin, sin], dim=-1).flatten(-2)])


def rotate(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """x (..., L, D) as D/2 pairs (re, im), each times its rotation: (a + ib)(c + id) in real arithmetic,
    written as x * (c, c) + (b, a) * (-d, d): every output element from its own element and its pair's
    (the same bits as re * c - im * d, re * d + im * c)."""
    cos, sin = rotations
    xf = x.float()
    swapped = xf.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (xf * cos + swapped * sin).type_as(x)


def apply_rotary_enc(
    xq: torch.Tensor, xk: torch.Tensor, rotations: torch.Tensor, repeat_freqs_k: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate (B, heads, L, D) queries and keys by (2, L, D) rotations (axial_rotations); with
    repeat_freqs_k the keys are several memory frames of L tokens each, every frame rotated like the queries."""
    xq_out = rotate(xq, rotations)
    if xk.shape[-2] == 0:  # no keys to rotate
        return xq_out, xk
    if repeat_freqs_k:
        return xq_out, rotate_frames(xk, rotations)
    return xq_out, rotate(xk, rotations)


def rotate_frames(xk: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Keys (..., frames * L, D) of several memory frames, each frame's L tokens rotated by the (2, L, D) rotations."""
    # the frames as a dimension of their own, each rotated by the same table
    frames = xk.unflatten(-2, (xk.shape[-2] // rotations.shape[-2], rotations.shape[-2]))
    return rotate(frames, rotations).flatten(-3, -2)


def rotated_keys_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """linear(x, weight, bias) (B, frames x L, C), each frame's L tokens rotated by rotations (2, L, C):
    the module path (RoPEAttention's k_proj, then apply_rotary_enc with repeat_freqs_k) that
    samfast.kernels.rotated_keys computes in one kernel, and falls back to."""
    return rotate_frames(F.linear(x, weight, bias), rotations)
