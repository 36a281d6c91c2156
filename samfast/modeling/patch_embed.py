"""A ViT's patch embedding: the strided convolution that makes an image into tokens (SAM 1's and SAM 3's)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PatchEmbed(nn.Module):
    """Image to patch embedding: a strided convolution, output channels-last (B, H, W, C).

    With `as_gemm` (set by the compile switch) the same product runs as one matrix multiply
    over non-overlapping patches: a 16x16 stride-16 convolution is exactly that. On an H100 in
    bf16, cuDNN runs the convolution of SAM's 3-channel input with a generic implicit-GEMM
    kernel (docs/measurements/ladder/ladder-bench-h100-2026-11-22-0f14c7f.md), for 4.8 GFLOP that a GEMM does in
    microseconds. The weights keep the conv layout.
    """

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.as_gemm = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.as_gemm:
            return self.proj(x).permute(0, 2, 3, 1)
        B, C, H, W = x.shape
        p = self.proj.stride[0]
        # (B, C, H/p, p, W/p, p) -> (B, H/p, W/p, C, p, p): each patch flattened in the weight's (C, p, p) order
        patches = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, H // p, W // p, C * p * p)
        return F.linear(patches, self.proj.weight.reshape(self.proj.out_channels, -1), self.proj.bias)
