"""samfast.sam2.SAM2ImagePredictor equals sam2's SAM2ImagePredictor end to end in fp32.

Same weights (samfast's seeded sam2.1_hiera_t loaded strictly into sam2's model), same images:
a real photo (sam-demo/dog.jpg under $SAMFAST_DATA, default ../shared/data beside the checkout)
and a generated one. Each set_image costs ~10 s per model on a 2-core CPU, so the images are
embedded once per module.

Tolerances: the pipeline runs the reference's operations in its order (the resize is the same
antialiased bilinear torchvision applies to a float tensor), so masks, scores and low-res logits
are the same bits: measured max abs diff 0.0 everywhere. Asserted exactly; loosen only with a
measured reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("sam2", reason="the SAM 2 reference package sam2==1.1.0 is not installed")

from samfast.sam2 import SAM2ImagePredictor
from samfast.sam2.build import build_sam2_model
from samfast.modeling.sam2_prompting.transforms import SAM2Transforms


def demo_photo() -> Path | None:
    configured = os.environ.get("SAMFAST_DATA")
    root = Path(configured) if configured else Path(__file__).resolve().parents[3] / "shared" / "data"
    path = root / "sam-demo" / "dog.jpg"
    return path if path.is_file() else None


def generated_image() -> np.ndarray:
    """A 300 x 420 scene (not square, so the stretch to 1024 x 1024 is anisotropic): two shapes on a gradient."""
    h, w = 300, 420
    y, x = np.mgrid[:h, :w]
    image = np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 90)], axis=-1).astype(np.uint8)
    image[(y - 120) ** 2 + (x - 140) ** 2 < 60**2] = (230, 40, 40)
    image[200:270, 250:380] = (30, 200, 60)
    return image


@pytest.fixture(scope="module")
def models():
    from sam2.build_sam import build_sam2

    # sam2's own attention path, so the same bits; the fp32 stage writes the softmax out, SAM 1's
    # reference order, within fp32 rounding of it (tests/unit/test_sam2_stages.py)
    ours = build_sam2_model("sam2.1_hiera_t", device="cpu", stages="fp32+sdpa")
    ref = build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", ckpt_path=None, device="cpu")
    ref.load_state_dict(ours.state_dict(), strict=True)
    return ours, ref


@pytest.fixture(scope="module", params=["photo", "generated"])
def predictors(request, models):
    """(image, samfast predictor, sam2 predictor), both with the image set."""
    from sam2.sam2_image_predictor import SAM2ImagePredictor as RefPredictor

    if request.param == "photo":
        path = demo_photo()
        if path is None:
            pytest.skip("no sam-demo/dog.jpg: set SAMFAST_DATA to the folder holding sam-demo/")
        image = np.array(Image.open(path).convert("RGB"))
    else:
        image = generated_image()
    ours, ref = SAM2ImagePredictor(models[0]), RefPredictor(models[1])
    ours.set_image(image)
    ref.set_image(image)
    return image, ours, ref


def assert_same_outputs(ours: tuple, ref: tuple) -> None:
    for o, r in zip(ours, ref):
        assert o.dtype == r.dtype and o.shape == r.shape
        np.testing.assert_array_equal(o, r)


def test_preprocessing_equals_sam2_transforms():
    from sam2.utils.transforms import SAM2Transforms as RefTransforms

    image = generated_image()
    ours, ref = SAM2Transforms(1024, 0.0), RefTransforms(1024, 0.0)
    assert torch.equal(ours(image), ref(image))
    assert torch.equal(ours(Image.fromarray(image)), ref(Image.fromarray(image)))
    assert torch.equal(ours.forward_batch([image, image[:200]]), ref.forward_batch([image, image[:200]]))


def test_image_embeddings_equal(predictors):
    _, ours, ref = predictors
    assert torch.equal(ours.get_image_embedding(), ref.get_image_embedding())
    for o, r in zip(ours._features["high_res_feats"], ref._features["high_res_feats"]):
        assert torch.equal(o, r)


def _prompts(image: np.ndarray) -> dict[str, dict]:
    h, w = image.shape[:2]
    return {
        "1 point, 3 masks": dict(point_coords=np.array([[w * 0.4, h * 0.5]]), point_labels=np.array([1])),
        "2 points + box": dict(
            point_coords=np.array([[w * 0.3, h * 0.4], [w * 0.7, h * 0.8]]),
            point_labels=np.array([1, 0]),
            box=np.array([w * 0.1, h * 0.2, w * 0.8, h * 0.9]),
            multimask_output=False,
        ),
        "box, logits": dict(box=np.array([w * 0.2, h * 0.1, w * 0.6, h * 0.7]), return_logits=True),
        "2 boxes": dict(box=np.array([[10, 10, w / 2, h / 2], [w / 3, h / 3, w - 5, h - 5]])),
        "normalized point, 1 mask": dict(
            point_coords=np.array([[0.5, 0.25]]),
            point_labels=np.array([1]),
            normalize_coords=False,
            multimask_output=False,
        ),
    }


@pytest.mark.parametrize(
    "prompt", ["1 point, 3 masks", "2 points + box", "box, logits", "2 boxes", "normalized point, 1 mask"]
)
def test_predict_equals_sam2(predictors, prompt):
    image, ours, ref = predictors
    kwargs = _prompts(image)[prompt]
    outputs = ours.predict(**kwargs), ref.predict(**kwargs)
    assert outputs[0][0].shape[-2:] == image.shape[:2]
    assert_same_outputs(*outputs)


def test_predict_with_previous_mask_equals_sam2(predictors):
    _, ours, ref = predictors
    first = ref.predict(point_coords=np.array([[100, 80]]), point_labels=np.array([1]))
    best = first[2][np.argmax(first[1])][None]
    kwargs = dict(point_coords=np.array([[100, 80], [150, 90]]), point_labels=np.array([1, 1]), mask_input=best)
    assert_same_outputs(ours.predict(**kwargs), ref.predict(**kwargs))


def test_predict_batch_equals_sam2(predictors, models):
    """predict_batch with sam2's signature over two images. The batch's embeddings are the set
    image's, repeated, given to both predictors: a second 1024 x 1024 encoder pass would cost
    20 s and set_image_batch's preprocessing is tested above."""
    from sam2.sam2_image_predictor import SAM2ImagePredictor as RefPredictor

    image, single, _ = predictors
    features = {
        "image_embed": single._features["image_embed"].repeat(2, 1, 1, 1),
        "high_res_feats": [level.repeat(2, 1, 1, 1) for level in single._features["high_res_feats"]],
    }
    batch = SAM2ImagePredictor(models[0]), RefPredictor(models[1])
    for predictor in batch:
        predictor._features, predictor._orig_hw = features, [image.shape[:2], image[:200].shape[:2]]
        predictor._is_image_set = predictor._is_batch = True
    kwargs = dict(
        point_coords_batch=[np.array([[60, 70]]), np.array([[30, 40], [90, 20]])],
        point_labels_batch=[np.array([1]), np.array([1, 0])],
        box_batch=[None, np.array([5, 5, 120, 150])],
        multimask_output=False,
    )
    ours, ref = (predictor.predict_batch(**kwargs) for predictor in batch)
    for o, r in zip(ours, ref):
        assert len(o) == len(r) == 2
        assert_same_outputs(o, r)


def test_hole_filling_is_skipped_with_a_warning_as_sam2_does_without_its_extension(predictors):
    _, ours, ref = predictors
    kwargs = dict(point_coords=np.array([[50, 60]]), point_labels=np.array([1]))
    filling = SAM2ImagePredictor(ours.model, max_hole_area=10.0, max_sprinkle_area=10.0)
    filling._features, filling._orig_hw, filling._is_image_set = ours._features, ours._orig_hw, True
    with pytest.warns(UserWarning, match="skipping the hole and sprinkle removal"):
        filled = filling.predict(**kwargs)
    assert_same_outputs(filled, ref.predict(**kwargs))


def test_reset_and_errors(models):
    predictor = SAM2ImagePredictor(models[0])
    with pytest.raises(RuntimeError, match=r"set_image"):
        predictor.predict(point_coords=np.array([[1, 1]]), point_labels=np.array([1]))
    with pytest.raises(RuntimeError, match=r"set_image_batch"):
        predictor.predict_batch()
    predictor.reset_predictor()
    assert predictor._features is None and not predictor._is_image_set


@pytest.fixture(scope="module")
def shared(predictors, models):
    """samfast.SamPredictor(sam2 model) with the image set as BGR: one encoder pass for both tests below
    (the second checks that its predict_batch leaves this image set)."""
    import samfast

    image, _, _ = predictors
    shared = samfast.SamPredictor(models[0])
    shared.set_image(np.ascontiguousarray(image[..., ::-1]), image_format="BGR")
    return shared


def test_the_shared_predictor_serves_a_sam2_model(predictors, shared):
    """samfast.SamPredictor(sam2 model): set_image (BGR too) and predict with the keyword arguments both
    references share give sam2's masks (as bool, SamPredictor's convention), scores and low-res logits."""
    import samfast
    from samfast.sam2 import SamPredictorForSAM2

    image, _, ref = predictors
    assert type(shared) is SamPredictorForSAM2 and isinstance(shared, samfast.SamPredictor)
    for name in ("1 point, 3 masks", "2 points + box", "box, logits"):
        kwargs = _prompts(image)[name]
        masks, iou, low_res = shared.predict(**kwargs)
        ref_masks, ref_iou, ref_low_res = ref.predict(**kwargs)
        assert masks.dtype == (np.float32 if kwargs.get("return_logits") else bool)
        np.testing.assert_array_equal(masks, ref_masks)
        np.testing.assert_array_equal(iou, ref_iou)
        np.testing.assert_array_equal(low_res, ref_low_res)


def test_the_shared_predict_batch_serves_a_sam2_model(predictors, shared):
    """SAM 1's predict_batch(images, prompts), which the parity gate's point task runs, given a SAM 2
    model: each image's point prompts and boxes give sam2's predict outputs for the same prompts
    (masks as bool), an image without prompts an empty Prediction, and the image set before stays set."""
    import samfast

    image, _, ref = predictors
    h, w = image.shape[:2]
    points = np.array([[[w * 0.4, h * 0.5]], [[w * 0.7, h * 0.3]]])
    boxes = np.array([[10, 10, w / 2, h / 2], [w / 3, h / 3, w - 5, h - 5]])
    with_points, empty, with_boxes = shared.predict_batch(
        [image, image[:50], image],
        [samfast.Prompts(point_coords=points, point_labels=np.ones((2, 1))), samfast.Prompts(),
         samfast.Prompts(boxes=boxes)])
    for got, kwargs in ((with_points, dict(point_coords=points, point_labels=np.ones((2, 1)))), (with_boxes, dict(box=boxes))):
        ref_masks, ref_iou, ref_low_res = ref.predict(**kwargs)
        assert got.masks.dtype == torch.bool
        np.testing.assert_array_equal(got.masks.numpy(), ref_masks.astype(bool))
        np.testing.assert_array_equal(got.iou_predictions.numpy(), ref_iou)
        np.testing.assert_array_equal(got.low_res_logits.numpy(), ref_low_res)
    assert empty.masks.shape == (0, 3, 50, w) and empty.low_res_logits.shape == (0, 3, 256, 256)
    masks, _, _ = shared.predict(point_coords=points[0], point_labels=np.ones(1))
    np.testing.assert_array_equal(masks, ref.predict(point_coords=points[0], point_labels=np.ones(1))[0].astype(bool))
    with pytest.raises(samfast.InputError, match="inverted"):
        shared.predict_batch([image], [samfast.Prompts(boxes=np.array([[50, 50, 10, 10]]))])
