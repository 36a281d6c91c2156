"""Image and prompt conversion into SAM's input frame (longest side 1024), as segment_anything does it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


class InputError(ValueError):
    """An image or prompt the predictor cannot take; the message names the value and the fix."""


# 16 bits per sample: PNG keeps at most 16, so a PNG that older Pillow opens as 32-bit "I" is 16-bit too.
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def read_image(path: Path) -> np.ndarray:
    """HxWx3 uint8 RGB of an image file, each mode converted by its real range, never clipped;
    InputError naming the file when it cannot be read.

    8-bit modes (L, P, RGB, RGBA, CMYK, ...) through PIL's convert. 16-bit grayscale: value / 257
    rounded (65535 -> 255; PIL's own convert would clip everything above 255 to white). 32-bit
    integer and float images have no defined range: refused.
    """
    try:
        with Image.open(path) as image:
            # No EXIF rotation: the pixels as stored, the frame COCO annotations refer to. np.array, not
            # np.asarray, because PIL's buffer is read-only and torch.from_numpy warns on such arrays.
            if image.mode in _SIXTEEN_BIT_MODES or (image.mode == "I" and image.format == "PNG"):
                gray = np.rint(np.array(image, dtype=np.float64) / 257).astype(np.uint8)
                return np.repeat(gray[:, :, None], 3, axis=2)
            if image.mode in ("I", "F"):
                kind = "32-bit integer" if image.mode == "I" else "floating-point"
                raise InputError(
                    f"{path} is a {kind} image (PIL mode {image.mode}) whose value range is not defined; "
                    "save it as an 8-bit or 16-bit image"
                )
            return np.array(image.convert("RGB"))
    except InputError:
        raise
    except Exception as err:  # PIL's decoders raise many kinds (OSError, SyntaxError, ValueError, ...)
        raise InputError(f"{path} is not a readable image ({type(err).__name__}: {err}); replace the file") from None


def preprocess_shape(old_h: int, old_w: int, long_side: int) -> tuple[int, int]:
    """(h, w) after scaling the longest side to `long_side`, rounded as the reference rounds.

    Never below one pixel: a 1x5000 strip would round to height 0, which no resize can make (the
    reference fails there); elsewhere the result is the reference's.
    """
    scale = long_side * 1.0 / max(old_h, old_w)
    return max(1, int(old_h * scale + 0.5)), max(1, int(old_w * scale + 0.5))


def to_rgb_uint8(image: np.ndarray, name: str = "image") -> np.ndarray:
    """HxWx3 uint8 RGB from grayscale (HxW or HxWx1), RGB or RGBA (alpha dropped) uint8 arrays.

    Other dtypes are refused, not guessed: a float image may be 0..1 or 0..255, a uint16 one
    0..65535 or 12 bits, and guessing wrong gives a black or white image with no error.
    """
    try:
        image = np.asarray(image)
    except ValueError as err:  # ragged nested lists
        raise InputError(f"{name} is not an array of pixels: {err}") from None
    if image.dtype != np.uint8:
        raise InputError(
            f"{name} must be uint8 with values 0..255, got {image.dtype}; convert it by its real range, "
            "e.g. (image * 255).round().astype(np.uint8) for floats in 0..1, (image / 257).round() for 16 bits"
        )
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise InputError(f"{name}: expected an HxW, HxWx3 or HxWx4 image, got shape {image.shape}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InputError(f"{name} is empty: shape {image.shape}")
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
        raise InputError(
            f"{what} ({x:g}, {y:g}) lies outside the {w}x{h} image: coordinates are (x, y) pixels of "
            f"the original image, x in [0, {w}] and y in [0, {h}] ({int(bad.sum())} of {len(coords)} outside)"
        )


def as_numbers(value, name: str) -> np.ndarray:
    """`value` as a float64 array, or InputError naming `name` when it is anything but finite numbers
    (strings, None, ragged nested lists, NaN): caught here rather than deep inside torch."""
    try:
        array = np.asarray(value)
    except ValueError as err:  # numpy refuses ragged nested sequences
        raise InputError(f"{name} must be a rectangular array of numbers: {err}") from None
    if array.dtype.kind not in "biuf":
        raise InputError(f"{name} must hold numbers, got an array of {array.dtype} ({preview(value)})")
    array = array.astype(float)
    if not np.isfinite(array).all():
        raise InputError(f"{name} must hold finite numbers, got {array[~np.isfinite(array)][0]} ({preview(value)})")
    return array


def check_labels(labels: np.ndarray, what: str = "point") -> None:
    """Refuse point labels other than 1 (foreground) and 0 (background). SAM's -1 marks padding
    points it adds itself, and 2, 3 its box corners: as user labels they would be silently wrong."""
    bad = ~np.isin(labels, (0, 1))
    if bad.any():
        value = labels[bad][0]
        raise InputError(
            f"{what} label {value:g} is not 0 (background) or 1 (foreground) ({int(bad.sum())} of "
            f"{labels.size} labels); -1 (padding) and 2, 3 (box corners) are SAM's own, never user labels"
        )


def preview(value) -> str:
    """repr(value), cut to 60 characters: enough of a bad value to recognise it in an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
