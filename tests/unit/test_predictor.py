"""SamPredictor input handling and the batched call (vit_tiny, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import samfast
from samfast import Prompts
from samfast.transforms import preprocess_shape
from tests.masks import assert_masks_equal_away_from_threshold

LOGITS_ATOL = 1e-4  # the same fp32 arithmetic in another order


@pytest.fixture(scope="module")
def predictor():
    return samfast.SamPredictor(samfast.build_sam("vit_tiny", device="cpu"))


def _image(h: int, w: int, channels: int | None = 3, seed: int = 0) -> np.ndarray:
    shape = (h, w) if channels is None else (h, w, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def test_grayscale_and_rgba_equal_their_rgb(predictor):
    gray = _image(300, 500, channels=None)
    predictor.set_image(gray)
    from_gray = predictor.features.clone()
    predictor.set_image(np.repeat(gray[:, :, None], 3, axis=2))
    torch.testing.assert_close(predictor.features, from_gray, rtol=0, atol=0)

    rgb = _image(200, 120)
    rgba = np.concatenate([rgb, np.full((200, 120, 1), 7, np.uint8)], axis=2)
    predictor.set_image(rgba)
    from_rgba = predictor.features.clone()
    predictor.set_image(rgb)
    torch.testing.assert_close(predictor.features, from_rgba, rtol=0, atol=0)


@pytest.mark.parametrize("h,w", [(37, 1500), (1024, 1024), (2000, 90), (1, 1)])
def test_any_size_and_aspect_ratio(predictor, h, w):
    predictor.set_image(_image(h, w))
    masks, iou, low_res = predictor.predict(point_coords=np.array([[w / 2, h / 2]]), point_labels=np.array([1]))
    assert masks.shape == (3, h, w) and masks.dtype == bool
    assert iou.shape == (3,) and low_res.shape == (3, 256, 256)
    assert np.isfinite(low_res).all()


def test_bad_images_are_refused(predictor):
    with pytest.raises(ValueError, match="uint8"):
        predictor.set_image(np.zeros((10, 10, 3), np.float32))
    with pytest.raises(ValueError, match=r"HxW, HxWx3 or HxWx4 image, got shape \(10, 10, 2\)"):
        predictor.set_image(np.zeros((10, 10, 2), np.uint8))
    with pytest.raises(ValueError, match="image_format must be 'RGB' or 'BGR'"):
        predictor.set_image(_image(10, 10), image_format="HSV")


def test_prompts_outside_the_image_are_refused(predictor):
    predictor.set_image(_image(480, 640))
    with pytest.raises(ValueError, match=r"point \(700, 10\) lies outside the 640x480 image"):
        predictor.predict(point_coords=np.array([[700, 10]]), point_labels=np.array([1]))
    with pytest.raises(ValueError, match=r"point \(-1, 10\) lies outside"):
        predictor.predict(point_coords=np.array([[-1, 10]]), point_labels=np.array([1]))
    with pytest.raises(ValueError, match=r"box corner \(600, 500\) lies outside the 640x480 image"):
        predictor.predict(box=np.array([10, 10, 600, 500]))
    with pytest.raises(ValueError, match="x1 >= x0"):
        predictor.predict(box=np.array([300, 10, 100, 200]))
    with pytest.raises(ValueError, match="point_labels must be given"):
        predictor.predict(point_coords=np.array([[10, 10]]))


def test_predict_before_set_image():
    with pytest.raises(RuntimeError, match="set_image"):
        samfast.SamPredictor(samfast.build_sam("vit_tiny", device="cpu")).predict(box=np.array([0, 0, 5, 5]))


def _batch():
    images = [_image(300, 400, seed=1), _image(500, 250, seed=2), _image(120, 160, channels=None, seed=3)]
    prompts = [
        Prompts(point_coords=np.array([[[100, 100]], [[350, 250]], [[10, 20]]]), point_labels=np.ones((3, 1))),
        Prompts(point_coords=np.array([[[200, 400]]]), point_labels=np.ones((1, 1))),
        Prompts(point_coords=np.array([[[80, 60]], [[5, 5]]]), point_labels=np.array([[1], [0]])),
    ]
    return images, prompts


@pytest.fixture(scope="module")
def batched(predictor) -> list:
    """predictor.predict_batch(*_batch()): the plain model's batched call, which two tests compare with
    (each image encoded once for both)."""
    return predictor.predict_batch(*_batch())


def test_predict_batch_equals_one_image_at_a_time(predictor, batched):
    images, prompts = _batch()
    for image, prompt, result in zip(images, prompts, batched):
        predictor.set_image(image)
        for j in range(len(prompt)):
            logits, iou, low_res = predictor.predict(prompt.point_coords[j], prompt.point_labels[j], return_logits=True)
            np.testing.assert_allclose(result.low_res_logits[j].numpy(), low_res, rtol=0, atol=LOGITS_ATOL)
            np.testing.assert_allclose(result.iou_predictions[j].numpy(), iou, rtol=0, atol=LOGITS_ATOL)
            assert_masks_equal_away_from_threshold(result.masks[j], logits, atol=LOGITS_ATOL)


def test_nested_tensor_prompts_equal_the_loop(predictor, batched):
    images, prompts = _batch()
    nested_model = samfast.build_sam("vit_tiny", device="cpu", stages="fp32+nt")
    assert nested_model.switches == {"nt"}
    nested = samfast.SamPredictor(nested_model).predict_batch(images, prompts)
    for image, a, b in zip(images, nested, batched, strict=True):
        torch.testing.assert_close(a.low_res_logits, b.low_res_logits, rtol=0, atol=LOGITS_ATOL)
        torch.testing.assert_close(a.iou_predictions, b.iou_predictions, rtol=0, atol=LOGITS_ATOL)
        # the loop's masks are these logits thresholded, at the image's input size (set_image's)
        original_size = image.shape[:2]
        input_size = preprocess_shape(*original_size, predictor.long_side)
        loop_logits = predictor.model.postprocess_masks(b.low_res_logits, input_size, original_size)
        assert_masks_equal_away_from_threshold(a.masks, loop_logits, atol=LOGITS_ATOL)


def test_nested_tensor_prompts_with_boxes():
    images, _ = _batch()
    prompts = [Prompts(boxes=np.array([[10, 10, 100, 80]] * n)) for n in (2, 1, 3)]
    loop = samfast.SamPredictor(samfast.build_sam("vit_tiny", device="cpu")).predict_batch(images, prompts)
    nested = samfast.SamPredictor(samfast.build_sam("vit_tiny", device="cpu", stages="fp32+nt")).predict_batch(images, prompts)
    for a, b in zip(nested, loop):
        torch.testing.assert_close(a.low_res_logits, b.low_res_logits, rtol=0, atol=LOGITS_ATOL)


def test_predict_batch_rejects_mismatched_lengths(predictor):
    with pytest.raises(ValueError, match="2 images but 1 prompt sets"):
        predictor.predict_batch([_image(10, 10), _image(10, 10)], [Prompts(boxes=np.array([[0, 0, 5, 5]]))])
