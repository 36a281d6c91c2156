"""Image and prompt conversion into SAM's input frame (longest side 1024), as segment_anything does it."""

from __future__ import annotations

import numpy as np
from PIL import Image


def preprocess_shape(old_h: int, old_w: int, long_side: int) -> tuple[int, int]:
    """(h, w) after scaling the longest side to `long_side`, rounded as the reference rounds."""
    scale = long_side * 1.0 / max(old_h, old_w)
    return int(old_h * scale + 0.5), int(old_w * scale + 0.5)


def to_rgb_uint8(image: np.ndarray) -> np.ndarray:
    """HxWx3 uint8 RGB from grayscale (HxW or HxWx1), RGB or RGBA (alpha dropped) uint8 arrays."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(
            f"images must be uint8 with values 0..255, got {image.dtype}; "
            "convert with (image * 255).round().astype(np.uint8) for floats in 0..1"
        )
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(f"expected an HxW, HxWx3 or HxWx4 image, got shape {image.shape}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"empty image of shape {image.shape}")
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def resize_longest_side(image: np.ndarray, long_side: int) -> np.ndarray:
    """Bilinear (antialiased) resize through PIL: the exact pixels the reference feeds its encoder."""
    h, w = preprocess_shape(image.shape[0], image.shape[1], long_side)
    return np.array(Image.fromarray(image).resize((w, h), Image.BILINEAR))


def scale_coords(coords: np.ndarray, original_size: tuple[int, int], long_side: int) -> np.ndarray:
    """(..., 2) pixel (x, y) coordinates of the original image -> the resized frame (float64)."""
    old_h, old_w = original_size
    new_h, new_w = preprocess_shape(old_h, old_w, long_side)
    coords = np.array(coords, dtype=float, copy=True)
    coords[..., 0] *= new_w / old_w
    coords[..., 1] *= new_h / old_h
    return coords


def check_inside(coords: np.ndarray, original_size: tuple[int, int], what: str) -> None:
    """Refuse (x, y) coordinates outside the image: they encode to positions SAM never saw."""
    h, w = original_size
    coords = np.asarray(coords, dtype=float).reshape(-1, 2)
    bad = ~((coords[:, 0] >= 0) & (coords[:, 0] <= w) & (coords[:, 1] >= 0) & (coords[:, 1] <= h))
    if bad.any():
        x, y = coords[np.argmax(bad)]
        raise ValueError(
            f"{what} ({x:g}, {y:g}) lies outside the {w}x{h} image: coordinates are (x, y) pixels of "
            f"the original image, x in [0, {w}] and y in [0, {h}] ({int(bad.sum())} of {len(coords)} outside)"
        )
