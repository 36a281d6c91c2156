"""samfast.SamAutomaticMaskGenerator returns segment_anything's records (CPU, fp32, the trained vit_tiny).

The end-to-end tests run both generators on the same weights and compare record by record: the
same count in the same order, the same prompt point and crop, scores to fp32 rounding and masks
pixel-equal up to a documented tolerance. The two models' logits differ by reordered fp32
additions (LOGITS_ATOL in tests/reference.py), so a pixel whose full-size logit sits within
that of the threshold may flip; MAX_FLIPPED_PIXELS bounds those per mask, and boxes and areas may
move by as much. The small helpers are checked against the reference's own on synthetic masks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils

import samfast
from parity.golden.scenes import generate_scenes
from samfast.amg import grids, masks, rle
from parity.reference import reference_sam

ref_amg = pytest.importorskip("segment_anything.utils.amg")

MAX_FLIPPED_PIXELS = 8  # per mask: pixels whose logit lies within fp32 rounding of the threshold
SCORE_ATOL = 1e-4  # predicted IoU: the models' logits tolerance
STABILITY_ATOL = 1e-3  # a ratio of pixel counts: MAX_FLIPPED_PIXELS over the smallest mask compared


@pytest.fixture(scope="module")
def models():
    ours = samfast.build_sam("vit_tiny", "trained", device="cpu")
    return ours, reference_sam("vit_tiny", ours.state_dict())


def _as_mask(segmentation) -> np.ndarray:
    if isinstance(segmentation, np.ndarray):
        return segmentation
    return mask_utils.decode({"size": segmentation["size"], "counts": segmentation["counts"].encode()}).astype(bool)


def assert_same_records(ours: list[dict], ref: list[dict]) -> None:
    assert len(ours) == len(ref), f"{len(ours)} masks vs the reference's {len(ref)}"
    for i, (a, b) in enumerate(zip(ours, ref)):
        where = f"record {i}"
        assert set(a) == set(b), where
        assert a["point_coords"] == b["point_coords"] and a["crop_box"] == b["crop_box"], where
        flipped = np.count_nonzero(_as_mask(a["segmentation"]) != _as_mask(b["segmentation"]))
        assert flipped <= MAX_FLIPPED_PIXELS, f"{where}: {flipped} pixels differ"
        assert abs(a["area"] - b["area"]) <= flipped, where
        np.testing.assert_allclose(a["bbox"], b["bbox"], atol=1 if flipped else 0, err_msg=where)
        assert a["predicted_iou"] == pytest.approx(b["predicted_iou"], abs=SCORE_ATOL), where
        assert a["stability_score"] == pytest.approx(b["stability_score"], abs=STABILITY_ATOL), where


def test_equals_reference_on_generated_scenes_batched(models):
    """Two scenes through one generate_batch, decoded 5 points per call (batches span both images)."""
    from segment_anything import SamAutomaticMaskGenerator as Reference

    ours, ref = models
    _, scenes = generate_scenes(2, seed=0)
    images = list(scenes.values())
    settings = dict(points_per_side=3, pred_iou_thresh=0.5, stability_score_thresh=0.8)
    batched = samfast.SamAutomaticMaskGenerator(ours, points_per_batch=5, **settings).generate_batch(images)
    assert sum(len(records) for records in batched) > 0, "nothing to compare: relax the thresholds"
    for image, records in zip(images, batched):
        assert_same_records(records, Reference(ref, **settings).generate(image))


@pytest.mark.slow(reason="both generators run 5 crops of a 1024 px photo with every mask kept: 73 s on a busy H200 "
                         "host's CPU layer")
def test_equals_reference_with_crops_on_a_photo(models, data_root):
    """crop_n_layers=1 (5 crops, NMS across them) with every mask let through the score filters."""
    from segment_anything import SamAutomaticMaskGenerator as Reference

    ours, ref = models
    image = np.array(Image.open(data_root / "sam-demo" / "dog.jpg").convert("RGB"))
    settings = dict(points_per_side=2, crop_n_layers=1,
                    pred_iou_thresh=0.0, stability_score_thresh=0.0, output_mode="coco_rle")
    records = samfast.SamAutomaticMaskGenerator(ours, **settings).generate(image)
    assert len({tuple(r["crop_box"]) for r in records}) > 1, "no mask from a crop: the crop path went unchecked"
    assert_same_records(records, Reference(ref, **settings).generate(image))


def test_min_mask_region_area_equals_reference(models):
    """Small holes filled and islands removed, then NMS again: the same records as the reference's
    opencv post-processing, and the step changes the result (38 masks -> 35 on this scene)."""
    pytest.importorskip("cv2", reason="the reference's small-region removal needs opencv: pip install opencv-python-headless")
    from segment_anything import SamAutomaticMaskGenerator as Reference

    ours, ref = models
    _, scenes = generate_scenes(1, seed=0)
    (image,) = scenes.values()
    settings = dict(points_per_side=4, pred_iou_thresh=0.0, stability_score_thresh=0.0)
    without = samfast.SamAutomaticMaskGenerator(ours, **settings).generate(image)
    records = samfast.SamAutomaticMaskGenerator(ours, min_mask_region_area=100, **settings).generate(image)
    assert len(records) < len(without), "no mask lost a small region: the post-processing went unchecked"
    assert_same_records(records, Reference(ref, min_mask_region_area=100, **settings).generate(image))


@pytest.mark.parametrize("mode", ["holes", "islands"])
def test_remove_small_regions_equals_opencvs(mode):
    """Random masks with many small regions (and one where every island is small: the largest stays)."""
    pytest.importorskip("cv2", reason="the reference's small-region removal needs opencv: pip install opencv-python-headless")
    from samfast.amg.small_regions import remove_small_regions

    rng = np.random.default_rng(0)
    cases = [(rng.random((40, 60)) < p, area) for p in (0.2, 0.5, 0.8) for area in (1, 3, 10, 50)]
    cases.append((np.pad(np.ones((2, 2), bool), 5) | np.pad(np.ones((3, 3), bool), ((0, 9), (9, 0))), 100))
    for mask, area in cases:
        ours, ours_changed = remove_small_regions(mask, area, mode)
        theirs, theirs_changed = ref_amg.remove_small_regions(mask, area, mode)
        assert ours_changed == theirs_changed and np.array_equal(ours, theirs), (mode, area)


# --- helpers against the reference's -------------------------------------------------------------
def test_grids_and_crop_boxes_equal_the_reference():
    for n, layers, downscale in [(32, 0, 1), (16, 2, 2), (5, 1, 1)]:
        for a, b in zip(grids.layer_point_grids(n, layers, downscale), ref_amg.build_all_layer_point_grids(n, layers, downscale), strict=True):
            np.testing.assert_array_equal(a, b)
    for size in [(534, 800), (1200, 900), (17, 33)]:
        boxes, layer_idxs = ref_amg.generate_crop_boxes(size, 2, 512 / 1500)
        assert grids.crop_boxes(size, 2, 512 / 1500) == list(zip(boxes, layer_idxs))


def _random_masks(n: int = 12, h: int = 37, w: int = 53) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(n, h, w, generator=gen).cumsum(1).cumsum(2) / 8  # blobs, not salt-and-pepper
    logits[0] = -1.0  # empty
    logits[1] = 1.0  # full
    logits[2, 5:9, 7:8] = 100.0  # one column
    return logits


def test_scores_boxes_and_edges_equal_the_reference():
    logits = _random_masks()
    # the empty mask scores 0 / 0 = nan in both
    torch.testing.assert_close(masks.stability_score(logits, 0.0, 1.0), ref_amg.calculate_stability_score(logits, 0.0, 1.0), rtol=0, atol=0, equal_nan=True)
    binary = logits > 0
    boxes = masks.mask_boxes(binary)
    torch.testing.assert_close(boxes, ref_amg.batched_mask_to_box(binary), rtol=0, atol=0)
    for crop in ([0, 0, 53, 37], [10, 0, 40, 30], [20, 7, 53, 37]):
        expected = ref_amg.is_box_near_crop_edge(boxes, crop, [0, 0, 53, 37], atol=4)
        torch.testing.assert_close(masks.near_crop_edge(boxes, crop, (37, 53), atol=4), expected, rtol=0, atol=0)


def test_rle_equals_the_reference_and_pycocotools():
    binary = _random_masks() > 0
    encoded = rle.change_points(binary)
    ours = rle.uncompressed_rles(encoded.first_value.numpy(), encoded.changes.numpy(), encoded.size)
    assert ours == ref_amg.mask_to_rle_pytorch(binary)
    for mask, r in zip(binary.numpy(), ours):
        np.testing.assert_array_equal(rle.rle_to_mask(r), mask)
        assert rle.rle_area(r) == mask.sum()
        assert rle.coco_rle(r) == ref_amg.coco_encode_rle(r)
        assert rle.coco_rle(r)["counts"] == mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode()


def test_planted_defect_a_flipped_mask_pixel_fails_the_record_check():
    record = {"segmentation": np.zeros((20, 20), bool), "area": 0, "bbox": [0, 0, 0, 0], "predicted_iou": 0.9,
              "point_coords": [[1.0, 1.0]], "stability_score": 0.9, "crop_box": [0, 0, 20, 20]}
    shifted = dict(record, segmentation=np.ones((20, 20), bool))
    with pytest.raises(AssertionError, match="pixels differ"):
        assert_same_records([shifted], [record])
    with pytest.raises(AssertionError, match="masks vs the reference"):
        assert_same_records([record, record], [record])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(points_per_side=None), "exactly one of points_per_side"),
        (dict(point_grids=[np.zeros((1, 2))]), "exactly one of points_per_side"),
        (dict(points_per_side=None, point_grids=[np.zeros((1, 2))], crop_n_layers=1), "one grid per crop layer"),
        (dict(points_per_side=0), "points_per_side must be at least 1"),
        (dict(crop_n_layers=-1), "crop_n_layers must be 0"),
        (dict(crop_n_points_downscale_factor=0), "crop_n_points_downscale_factor must be at least 1"),
        (dict(output_mode="png"), "unknown output_mode"),
        (dict(points_per_batch=0), "points_per_batch"),
        (dict(min_mask_region_area=-1), "min_mask_region_area"),
    ],
)
def test_bad_arguments_are_refused_clearly(models, kwargs, message):
    with pytest.raises(ValueError, match=message):
        samfast.SamAutomaticMaskGenerator(models[0], **kwargs)
