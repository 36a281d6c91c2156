"""Ground truth in the frame of SAM's low-res logits, and flips that keep SAM's padding where it is.

SAM resizes an image so that its longest side is 1024, pads it at the bottom and right to the
1024 square, and predicts mask logits on a 256 x 256 grid over that square. Targets live on that
grid (soft covered fractions, see `lowres_target`), and the flips mirror images and targets only
inside their valid corner, so the padding stays bottom-right, as SAM sees it at inference.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from samfast.config import IMAGE_SIZE

LOW_RES = 256  # side of the decoder's logits: 4 x the 64 x 64 image embedding
CELL = IMAGE_SIZE // LOW_RES  # input pixels (of the padded 1024 square) per low-res cell


def lowres_target(mask: np.ndarray, input_size: tuple[int, int]) -> np.ndarray:
    """The fraction of each 256 x 256 logits cell that the mask covers, float32 in [0, 1].

    SAM resizes the image so that its longest side is 1024 (input_size = (h, w), from
    samfast.transforms.preprocess_shape), pads it to 1024 x 1024 at the bottom and right, and
    predicts logits on a 256 x 256 grid over that padded square; Sam.postprocess_masks upsamples
    them to 1024, crops [:h, :w] and resizes to the original (H, W). So cell (i, j) covers input
    pixels [4i, 4i + 4) x [4j, 4j + 4), i.e. original pixels [4i H/h, (4i + 4) H/h) x
    [4j W/w, (4j + 4) W/w): a box with fractional edges, integrated exactly from the mask's
    summed-area table (which is bilinear between whole pixels). Cells over padding get 0, cells
    across the crop edge the covered share of their full area.
    """
    mask = np.asarray(mask, dtype=bool)
    H, W = mask.shape
    h, w = input_size
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return np.zeros((LOW_RES, LOW_RES), dtype=np.float32)
    # Integrate over the mask's bounding box only: outside it the mask is empty, so the integral
    # up to any point equals the box's summed-area table at that point clipped into the box.
    y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    table = np.zeros((y1 - y0 + 1, x1 - x0 + 1))
    table[1:, 1:] = mask[y0:y1, x0:x1].cumsum(0, dtype=np.float64).cumsum(1)
    r, r_frac = _edges(H, h, y0, y1)
    c, c_frac = _edges(W, w, x0, x1)
    table = table[r] * (1 - r_frac)[:, None] + table[r + 1] * r_frac[:, None]
    table = table[:, c] * (1 - c_frac) + table[:, c + 1] * c_frac  # (257, 257): the integral at cell corners
    area = table[1:, 1:] - table[:-1, 1:] - table[1:, :-1] + table[:-1, :-1]
    cell_area = (CELL * H / h) * (CELL * W / w)
    return np.clip(area / cell_area, 0.0, 1.0).astype(np.float32)


def _edges(original: int, resized: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The 257 cell edges along one axis, in original pixels relative to the box [lo, hi) and
    clipped into it, as (whole part, fraction) for interpolating the box's summed-area table."""
    edges = np.clip(np.arange(LOW_RES + 1) * (CELL * original / resized) - lo, 0, hi - lo)
    whole = np.minimum(np.floor(edges), hi - lo - 1).astype(np.int64)
    return whole, edges - whole


def flip_images(images: torch.Tensor, sizes: torch.Tensor, hflip: torch.Tensor, vflip: torch.Tensor) -> torch.Tensor:
    """Mirror (B, C, S, S) images inside their valid (h, w) corner; sizes (B, 2) as (h, w)."""
    side = images.shape[-1]
    pos = torch.arange(side, device=images.device)[None]
    h, w = sizes[:, :1], sizes[:, 1:]
    cols = torch.where(hflip[:, None] & (pos < w), w - 1 - pos, pos)
    rows = torch.where(vflip[:, None] & (pos < h), h - 1 - pos, pos)
    images = images.gather(3, cols[:, None, None, :].expand(images.shape))
    return images.gather(2, rows[:, None, :, None].expand(images.shape))


def flip_targets(targets: torch.Tensor, sizes: torch.Tensor, hflip: torch.Tensor, vflip: torch.Tensor) -> torch.Tensor:
    """Mirror (P, 256, 256) low-res targets the way flip_images mirrors their images.

    Mirroring input column x to w - x moves cell u's centre (4u + 2) to w - 4u - 2, which is
    cell coordinate w/4 - 1 - u: whole when w is a multiple of 4 (exact), otherwise between two
    cells, where the covered fractions are interpolated linearly.
    """
    sizes = sizes.to(targets.dtype)
    targets = _resample_last(targets, sizes[:, 1], hflip)
    return _resample_last(targets.transpose(1, 2), sizes[:, 0], vflip).transpose(1, 2)


def _resample_last(targets: torch.Tensor, extent: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    grid = targets.shape[-1]
    u = torch.arange(grid, device=targets.device, dtype=targets.dtype)[None]
    source = torch.where(flip[:, None], extent[:, None] / CELL - 1 - u, u)  # (P, grid)
    whole = torch.floor(source)
    frac = (source - whole)[:, None, :]
    padded = F.pad(targets, (1, 0))  # index 0 stands for "left of the image": empty
    lo = (whole + 1).clamp(0, grid).long()[:, None, :].expand(targets.shape)
    hi = (whole + 2).clamp(0, grid).long()[:, None, :].expand(targets.shape)
    return padded.gather(-1, lo) * (1 - frac) + padded.gather(-1, hi) * frac
