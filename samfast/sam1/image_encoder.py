"""ViT image encoder with windowed + global attention and decomposed relative position (ViTDet).

Parameter names and shapes equal segment_anything's, so official checkpoints load unchanged.
Unlike the reference, nothing here assumes the default dtype or builds index tensors on the
host: the relative-position coordinates are made on the parameters' device, which removes a
host-device copy (and its sync) per block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast import kernels
from samfast.modeling.attention import attention_with_relpos
from samfast.modeling.common import LayerNorm2d, MLPBlock
from samfast.modeling.patch_embed import PatchEmbed


class ImageEncoderViT(nn.Module):
    def __init__(
        self,
        img_size: int = 1024,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        out_chans: int = 256,
        window_size: int = 14,
        global_attn_indexes: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.img_size = img_size
        grid = img_size // patch_size
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, grid, grid, embed_dim))
        self.blocks = nn.ModuleList(
            Block(
                dim=embed_dim,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                window_size=0 if i in global_attn_indexes else window_size,
                input_size=(grid, grid),
            )
            for i in range(depth)
        )
        self.neck = nn.Sequential(
            nn.Conv2d(embed_dim, out_chans, kernel_size=1, bias=False),
            LayerNorm2d(out_chans),
            nn.Conv2d(out_chans, out_chans, kernel_size=3, padding=1, bias=False),
            LayerNorm2d(out_chans),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.neck(x.permute(0, 3, 1, 2))


class Block(nn.Module):
    """Pre-norm transformer block; attention over 14x14 windows or, when window_size is 0, the whole grid."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        window_size: int,
        input_size: tuple[int, int],
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(
            dim, num_heads, input_size=input_size if window_size == 0 else (window_size, window_size)
        )
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLPBlock(dim, int(dim * mlp_ratio))
        self.window_size = window_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.window_size > 0:
            H, W = x.shape[1], x.shape[2]
            x, pad_hw = window_partition(x, self.window_size)
            x = self.attn(x)
            x = window_unpartition(x, self.window_size, pad_hw, (H, W))
        else:
            x = self.attn(x)
        x = shortcut + x
        return x + self.mlp(self.norm2(x))


class Attention(nn.Module):
    """Multi-head attention with decomposed relative position bias (rel_h + rel_w)."""

    def __init__(self, dim: int, num_heads: int, input_size: tuple[int, int]) -> None:
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * input_size[0] - 1, head_dim))
        self.rel_pos_w = nn.Parameter(torch.zeros(2 * input_size[1] - 1, head_dim))
        self.attn_impl = "math"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, _ = x.shape
        # q, k, v stacked: (3, B, heads, H*W, head_dim), views of the projection
        qkv = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        table_h, table_w = resized_rel_pos(self.rel_pos_h, 2 * H - 1), resized_rel_pos(self.rel_pos_w, 2 * W - 1)
        if self.attn_impl == "triton" and kernels.forms_bias_from_tables(qkv, table_h, table_w):
            # windowed blocks: the kernel forms rel_h / rel_w from q itself, sparing the two
            # batched products below and the copy of q each needs (docs/relpos-windowed-attention-h100.md)
            x = kernels.relpos_attention_from_tables(qkv, table_h, table_w, self.scale)
        else:
            rel_h, rel_w = decomposed_rel_pos(qkv[0], table_h, table_w, (H, W))
            x = attention_with_relpos(qkv, rel_h, rel_w, self.scale, self.attn_impl)
        x = x.view(B, self.num_heads, H, W, -1).permute(0, 2, 3, 1, 4).reshape(B, H, W, -1)
        return self.proj(x)


def window_partition(x: torch.Tensor, window_size: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """(B, H, W, C) -> (B * windows, ws, ws, C), zero-padding H and W up to multiples of ws."""
    B, H, W, C = x.shape
    pad_h = (window_size - H % window_size) % window_size
    pad_w = (window_size - W % window_size) % window_size
    if pad_h > 0 or pad_w > 0:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    Hp, Wp = H + pad_h, W + pad_w
    x = x.view(B, Hp // window_size, window_size, Wp // window_size, window_size, C)
    windows = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)
    return windows, (Hp, Wp)


def window_unpartition(
    windows: torch.Tensor, window_size: int, pad_hw: tuple[int, int], hw: tuple[int, int]
) -> torch.Tensor:
    """Inverse of window_partition, dropping the padding."""
    Hp, Wp = pad_hw
    H, W = hw
    B = windows.shape[0] // (Hp * Wp // window_size // window_size)
    x = windows.view(B, Hp // window_size, Wp // window_size, window_size, window_size, -1)
    x = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, Hp, Wp, -1)
    if Hp > H or Wp > W:
        x = x[:, :H, :W, :].contiguous()
    return x


def resized_rel_pos(rel_pos: torch.Tensor, length: int) -> torch.Tensor:
    """The (length, C) table: rel_pos itself, or linearly interpolated when trained at another size."""
    if rel_pos.shape[0] == length:
        return rel_pos
    return F.interpolate(
        rel_pos.reshape(1, rel_pos.shape[0], -1).permute(0, 2, 1), size=length, mode="linear"
    ).reshape(-1, length).permute(1, 0)


def get_rel_pos(q_size: int, k_size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    """Relative position embeddings for every (query, key) pair along one axis: (q_size, k_size, C)."""
    max_rel_dist = int(2 * max(q_size, k_size) - 1)
    rel_pos = resized_rel_pos(rel_pos, max_rel_dist)
    # Built on rel_pos's device: the reference builds them on the host and pays a copy + sync.
    device = rel_pos.device
    q_coords = torch.arange(q_size, device=device)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size, device=device)[None, :] * max(q_size / k_size, 1.0)
    relative_coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return rel_pos[relative_coords.long()]


def decomposed_rel_pos(
    q: torch.Tensor, rel_pos_h: torch.Tensor, rel_pos_w: torch.Tensor, size: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two factors of the MViTv2 decomposed bias for q of shape (B, heads, h*w, C).

    Returns rel_h (B, heads, h*w, h) and rel_w (B, heads, h*w, w): the bias between query i and
    key j = (jh, jw) is rel_h[..., i, jh] + rel_w[..., i, jw].
    """
    h, w = size
    Rh = get_rel_pos(h, h, rel_pos_h)
    Rw = get_rel_pos(w, w, rel_pos_w)
    B, heads, _, dim = q.shape
    r_q = q.reshape(B * heads, h, w, dim)
    rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, Rh).reshape(B, heads, h * w, h)
    rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, Rw).reshape(B, heads, h * w, w)
    return rel_h, rel_w
