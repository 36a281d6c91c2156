"""samfast.sam2.SAM2AutomaticMaskGenerator returns sam2's SAM2AutomaticMaskGenerator's records in fp32.

Same weights (samfast's seeded sam2.1_hiera_t loaded strictly into sam2's model), a small generated
image, a 4 x 4 grid. Records are compared one by one: same count, same order, same point, crop
box, box, area and mask pixels; predicted IoU within fp32 rounding (measured: 1 ulp, 9e-8, the
decoder's batched matmuls), stability score exactly (a ratio of equal pixel counts).

The image encoder runs at 1024 x 1024 whatever the image size (~9 s per call on a 2-core CPU), so
each model keeps its own encoder outputs per distinct input (`remember_encoder`): every generator
call after the first of an image decodes against what that same model computed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sam2", reason="the SAM 2 reference package sam2==1.1.0 is not installed")

import samfast
from samfast.sam2 import SAM2AutomaticMaskGenerator
from samfast.sam2.build import build_sam2_model

IOU_ATOL = 1e-6  # predicted IoU: fp32 rounding of a value in [0, 1]


def remember_encoder(model) -> None:
    """Memoize model.forward_image per input (its outputs are only read: a fresh dict and lists each call)."""
    compute, seen = model.forward_image, {}

    def forward_image(img_batch: torch.Tensor):
        key = (tuple(img_batch.shape), img_batch.numpy().tobytes())
        if key not in seen:
            seen[key] = compute(img_batch)
        return {k: list(v) if isinstance(v, list) else v for k, v in seen[key].items()}

    model.forward_image = forward_image


@pytest.fixture(scope="module")
def models():
    from sam2.build_sam import build_sam2

    ours = build_sam2_model("sam2.1_hiera_t", device="cpu")
    ref = build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", ckpt_path=None, device="cpu")
    ref.load_state_dict(ours.state_dict(), strict=True)
    for model in (ours, ref):
        remember_encoder(model)
    return ours, ref


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    """96 x 128 (not square: the stretch to 1024 x 1024 is anisotropic), a disc and a box on a gradient."""
    h, w = 96, 128
    y, x = np.mgrid[:h, :w]
    image = np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 90)], axis=-1).astype(np.uint8)
    image[(y - 40) ** 2 + (x - 50) ** 2 < 20**2] = (230, 40, 40)
    image[60:90, 80:120] = (30, 200, 60)
    return image


def assert_same_records(ours: list[dict], ref: list[dict]) -> None:
    assert len(ours) == len(ref), f"{len(ours)} masks vs sam2's {len(ref)}"
    for i, (a, b) in enumerate(zip(ours, ref)):
        where = f"record {i}"
        assert set(a) == set(b), where
        for key in ("point_coords", "crop_box", "bbox", "area", "stability_score"):
            assert a[key] == b[key], f"{where}: {key} {a[key]} vs {b[key]}"
        np.testing.assert_array_equal(a["segmentation"], b["segmentation"], err_msg=where)
        assert a["predicted_iou"] == pytest.approx(b["predicted_iou"], abs=IOU_ATOL), where


def run_both(models, image, **settings) -> tuple[list[dict], list[dict]]:
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator as Reference

    ours, ref = models
    return SAM2AutomaticMaskGenerator(ours, **settings).generate(image), Reference(ref, **settings).generate(image)


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [dict(points_per_side=4, points_per_batch=5), dict(points_per_side=3, use_m2m=True)],
    ids=["plain", "m2m"],
)
def test_records_equal_sam2_with_thresholds_at_zero(models, image, settings):
    """Every mask through the score filters (seeded weights score low), then box NMS. plain: batches
    of 5 points, so a batch ends inside the grid; m2m: each of the 27 masks refined with its own
    low-res logits, in a batch of 64 that spans points."""
    ours, ref = run_both(models, image, pred_iou_thresh=0.0, stability_score_thresh=0.0, **settings)
    assert ours, "nothing to compare"
    assert_same_records(ours, ref)


@pytest.mark.slow
def test_records_equal_sam2_at_its_defaults(models, image):
    """sam2's defaults (pred_iou_thresh 0.8, stability 0.95) filter every seeded-weight mask away, as sam2's do."""
    ours, ref = run_both(models, image, points_per_side=4)
    assert ours == ref == []


def test_the_shared_generator_serves_a_sam2_model_with_sam2s_parameters(models):
    ours, _ = models
    generator = samfast.SamAutomaticMaskGenerator(ours, points_per_side=4, use_m2m=True)
    assert type(generator) is SAM2AutomaticMaskGenerator
    assert (generator.pred_iou_thresh, generator.mask_threshold, generator.use_m2m, generator.multimask_output) == (
        0.8, 0.0, True, True)
    sam1 = samfast.SamAutomaticMaskGenerator(samfast.build_sam("vit_tiny", device="cpu"), points_per_side=4)
    assert type(sam1) is samfast.SamAutomaticMaskGenerator and sam1.pred_iou_thresh == 0.88


@pytest.mark.slow(reason="a 9 x 9 grid decoded in memory-sized calls with every mask kept: 86 s on a busy H200 "
                         "host's CPU layer")
def test_points_per_batch_none_decodes_as_many_points_as_fit_64_on_a_cpu(models, image):
    """None sizes the decoder calls by memory, as SAM 1's generator does (it once decoded every point
    in one call: sam2's default 32 x 32 grid took 24 GB of host memory with the nano on a CPU)."""
    ours, _ = models
    settings = dict(points_per_side=9, pred_iou_thresh=0.0, stability_score_thresh=0.0)
    generator = SAM2AutomaticMaskGenerator(ours, points_per_batch=None, **settings)
    decode, calls = generator.predictor._decode, []

    def counted(points, *args, **kwargs):
        calls.append(len(points))
        return decode(points, *args, **kwargs)

    generator.predictor._decode = counted
    records = generator.generate(image)
    assert calls == [64, 17]
    assert_same_records(records, SAM2AutomaticMaskGenerator(ours, points_per_batch=64, **settings).generate(image))
