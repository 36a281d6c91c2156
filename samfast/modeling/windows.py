"""Cutting a (B, H, W, C) map into non-overlapping windows and back, padding where H or W is not a multiple."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def to_windows(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, W, C) map, H and W multiples of size -> (B, H / size, W / size, size, size, C) windows, contiguous."""
    b, h, w, c = x.shape
    return x.view(b, h // size, size, w // size, size, c).permute(0, 1, 3, 2, 4, 5).contiguous()


def from_windows(windows: torch.Tensor) -> torch.Tensor:
    """The inverse of to_windows: (B, H, W, C)."""
    b, nh, nw, size, _, c = windows.shape
    return windows.permute(0, 1, 3, 2, 4, 5).reshape(b, nh * size, nw * size, c)


def window_partition(x: torch.Tensor, window_size: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """(B * num_windows, window_size, window_size, C) windows and the padded (Hp, Wp).

    Padding is zeros at the bottom and right: Hiera-T's 64x64 stage has 14x14 windows, so it
    attends over a 70x70 map whose last row and column of windows are partly padding.
    """
    b, h, w, c = x.shape
    pad_h = (window_size - h % window_size) % window_size
    pad_w = (window_size - w % window_size) % window_size
    if pad_h > 0 or pad_w > 0:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    windows = to_windows(x, window_size).view(-1, window_size, window_size, c)
    return windows, (h + pad_h, w + pad_w)


def window_unpartition(
    windows: torch.Tensor, window_size: int, pad_hw: tuple[int, int], hw: tuple[int, int]
) -> torch.Tensor:
    """The inverse of window_partition: (B, H, W, C), padding dropped."""
    hp, wp = pad_hw
    h, w = hw
    b = windows.shape[0] // (hp * wp // window_size // window_size)
    x = from_windows(windows.reshape(b, hp // window_size, wp // window_size, window_size, window_size, -1))
    if hp > h or wp > w:
        x = x[:, :h, :w, :]
    return x
