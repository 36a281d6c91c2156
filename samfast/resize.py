"""PIL's bilinear resize of uint8 images, pixel for pixel, as torch operations on any device.

The reference resizes every image with PIL on the host (`Image.resize(..., BILINEAR)`), which on
a GPU run means a host resize, then pinning and copying the 3 MiB result: more of a
segment-everything call than the vit_b encoder (docs/amg.md). Here the small original is copied and resized on the
device with PIL's own arithmetic (Pillow's Resample.c), so the pixels are the same bytes:

- per output pixel, the taps and weights of a triangle filter stretched by the scale when
  shrinking (antialiasing), computed in float64 and normalised to sum 1, then rounded to
  fixed point with 22 fraction bits (PRECISION_BITS = 32 - 8 - 2);
- a horizontal pass, then a vertical pass, each summing integer pixel x weight products with a
  half in the last place added, shifted right by 22 (floor) and clipped to 0..255, so the
  intermediate image is rounded to uint8 as PIL's is.

A float resize (F.interpolate with antialias) differs from PIL in 11-15% of pixels by one level;
this one is tested equal to PIL byte for byte (tests/unit/test_resize.py).

The order of the passes is Pillow's choice, and newer Pillow (python-pillow/Pillow#9549, 2026)
resizes vertically first when the height shrinks much more than the width, by a rule of its own
that is not reproduced here. `same_as_pil` says where the horizontal-first order is certain: the
height does not shrink, or the image is not taller than wide (SAM's longest-side resizes scale
both sides alike, so a landscape image never trips Pillow's rule). Elsewhere callers use PIL.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from samfast.transfer import to_device

PRECISION_BITS = 32 - 8 - 2  # Pillow's fixed point for 8-bit images
BILINEAR_SUPPORT = 1.0


def _bilinear_filter(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def pil_coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(first tap (out,), fixed-point weights (out, taps)) of one axis, as Pillow's precompute_coeffs
    and normalize_coeffs_8bpc compute them for the box (0, in_size). Taps past the end weigh 0."""
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = BILINEAR_SUPPORT * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    centers = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    # C's (int) cast truncates toward zero: the values here are >= -support + 0.5 > -1, so for the
    # lower bound a negative value truncates to 0, which the clamp to 0 then keeps.
    xmin = np.maximum(np.trunc(centers - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(centers + support + 0.5), in_size).astype(np.int64) - xmin
    taps = np.arange(ksize)
    # the same float64 operations in the same order as Pillow: x * (1 / filterscale), not x / filterscale,
    # and the weights summed tap by tap (numpy's pairwise sum could differ in the last bit)
    weights = _bilinear_filter((taps[None, :] + xmin[:, None] - centers[:, None] + 0.5) * (1.0 / filterscale))
    weights = np.where(taps[None, :] < xmax[:, None], weights, 0.0)
    total = np.zeros(out_size)
    for tap in taps:
        total += weights[:, tap]
    weights = np.divide(weights, total[:, None], out=weights, where=total[:, None] != 0.0)
    scaled = weights * (1 << PRECISION_BITS)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)
    return xmin, fixed


def _resample_axis(image: torch.Tensor, out_size: int, axis: int) -> torch.Tensor:
    """One PIL pass along `axis` of a uint8 image: integer sums, rounded and clipped to uint8."""
    in_size = image.shape[axis]
    if in_size == out_size:  # PIL skips the pass; its weights would be the identity anyway
        return image
    first, weights = pil_coefficients(in_size, out_size)
    device = image.device
    # through pinned memory: a plain copy of host arrays would make the CPU wait for the GPU (a sync)
    first = to_device(first, torch.int64, device)
    weights = to_device(weights, torch.int32, device)
    shape = [1] * image.ndim
    shape[axis] = out_size
    pixels = image.to(torch.int32)
    # int32 holds the sums: 255 x (2^22 + taps) + 2^21 < 2^31. One tap at a time keeps memory at
    # one output-sized tensor whatever the shrink factor.
    total = torch.full((), 1 << (PRECISION_BITS - 1), dtype=torch.int32, device=device)
    for tap in range(weights.shape[1]):
        index = (first + tap).clamp_(max=in_size - 1)  # clamped taps weigh 0
        total = total + pixels.index_select(axis, index) * weights[:, tap].view(shape)
    return (total >> PRECISION_BITS).clamp_(0, 255).to(torch.uint8)


def same_as_pil(in_size: tuple[int, int], out_size: tuple[int, int]) -> bool:
    """Whether pil_bilinear_resize gives PIL's bytes for a longest-side resize (h, w) -> (h', w') whatever the Pillow version."""
    (in_h, in_w), (out_h, _) = in_size, out_size
    return out_h >= in_h or in_w >= in_h


def pil_bilinear_resize(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """HxWxC uint8 -> (h, w)xC uint8, equal to np.array(Image.fromarray(image).resize((w, h), Image.BILINEAR))."""
    if image.dtype != torch.uint8 or image.ndim != 3:
        raise ValueError(f"expected an HxWxC uint8 image, got {image.dtype} of shape {tuple(image.shape)}")
    h, w = size
    return _resample_axis(_resample_axis(image, w, axis=1), h, axis=0)
