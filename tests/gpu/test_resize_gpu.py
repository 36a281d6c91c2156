"""On the GPU the predictor resizes on the device, and its input equals the reference's PIL resize byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import samfast
from samfast.resize import same_as_pil
from samfast.transforms import preprocess_shape, resize_longest_side

pytestmark = pytest.mark.gpu


def test_device_resize_equals_pil(data_root):
    predictor = samfast.SamPredictor(samfast.build_sam("vit_tiny", device="cuda"))
    photos = sorted((data_root / "sam-demo").glob("*.jpg")) + sorted((data_root / "coco-mini").rglob("*.jpg"))
    on_device = 0
    for path in photos:
        image = np.array(Image.open(path).convert("RGB"))
        on_device += same_as_pil(image.shape[:2], preprocess_shape(*image.shape[:2], 1024))
        got = predictor._to_input(image).permute(1, 2, 0).cpu().numpy()
        np.testing.assert_array_equal(got, resize_longest_side(image, 1024), err_msg=path.name)
    assert on_device >= len(photos) // 2  # the device path ran, not only the PIL fallback
