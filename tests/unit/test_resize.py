"""samfast.resize equals the installed PIL's bilinear resize byte for byte wherever same_as_pil says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from samfast.resize import pil_bilinear_resize, same_as_pil
from samfast.transforms import preprocess_shape, resize_longest_side


def _pil(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return np.array(Image.fromarray(image).resize((size[1], size[0]), Image.BILINEAR))


def _random_sizes(rng, n: int) -> list[tuple[int, int]]:
    """Landscape, square, portrait, strips: up- and downscaled by the longest-side resize."""
    sizes = [(int(rng.integers(1, 2600)), int(rng.integers(1, 2600))) for _ in range(n)]
    return sizes + [(534, 800), (480, 640), (1024, 1024), (768, 1024), (3000, 4000), (1, 3000), (3000, 1), (17, 5), (1025, 1023)]


def test_longest_side_resizes_equal_pil_wherever_same_as_pil_holds():
    rng = np.random.default_rng(0)
    checked = 0
    for h, w in _random_sizes(rng, 60):
        size = preprocess_shape(h, w, 1024)
        if not same_as_pil((h, w), size):
            continue
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        got = pil_bilinear_resize(torch.from_numpy(image), size).numpy()
        np.testing.assert_array_equal(got, _pil(image, size), err_msg=f"{h}x{w} -> {size}")
        checked += 1
    assert checked >= 30  # most random sizes are landscape or upscaled: the check compared many


def test_any_resize_equals_pil_when_the_height_does_not_shrink():
    """Not only SAM's shapes: other scales per axis, shrinking widths (antialiasing, wide filters)."""
    rng = np.random.default_rng(1)
    for (h, w), (oh, ow) in [((40, 300), (40, 7)), ((40, 300), (90, 29)), ((5, 5), (64, 3)), ((100, 100), (100, 200))]:
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        np.testing.assert_array_equal(pil_bilinear_resize(torch.from_numpy(image), (oh, ow)).numpy(), _pil(image, (oh, ow)))


def test_real_photos_equal_the_predictor_resize(data_root):
    photos = sorted((data_root / "sam-demo").glob("*.jpg")) + sorted((data_root / "coco-mini").rglob("*.jpg"))[:6]
    assert photos
    for path in photos:
        image = np.array(Image.open(path).convert("RGB"))
        want = resize_longest_side(image, 1024)
        if same_as_pil(image.shape[:2], want.shape[:2]):
            np.testing.assert_array_equal(pil_bilinear_resize(torch.from_numpy(image), want.shape[:2]).numpy(), want, err_msg=path.name)


def test_a_planted_off_by_one_weight_is_caught(monkeypatch):
    """The equality above can fail: one fixed-point weight one unit off changes PIL-equal pixels."""
    import samfast.resize as resize

    rng = np.random.default_rng(2)
    image = rng.integers(0, 256, (534, 800, 3), dtype=np.uint8)
    size = preprocess_shape(534, 800, 1024)
    real = resize.pil_coefficients

    def off_by_one(in_size, out_size):
        first, weights = real(in_size, out_size)
        return first, weights + (weights > 0)

    monkeypatch.setattr(resize, "pil_coefficients", off_by_one)
    assert not np.array_equal(pil_bilinear_resize(torch.from_numpy(image), size).numpy(), _pil(image, size))


@pytest.mark.parametrize("bad", [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 3), np.float32)])
def test_refuses_what_is_not_an_hwc_uint8_image(bad):
    with pytest.raises(ValueError, match="HxWxC uint8"):
        pil_bilinear_resize(torch.from_numpy(bad), (2, 2))
