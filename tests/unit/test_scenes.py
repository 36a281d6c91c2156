import hashlib
import json

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from parity.golden.data import load_dataset
from parity.golden.scenes import CATEGORIES, generate_scenes

# Digests of generate_scenes(16, seed=0), the embedded "scenes" dataset: pinned so that a machine,
# numpy or Python that draws different bits fails here instead of silently shifting goldens.
SCENES_JSON_SHA256 = "694709b476a97f8ab1e0e4738ee7a7bebe68a61cc97fb8d23d2ea528b2bcda57"
SCENES_IMAGES_SHA256 = "4aff5d6ce95183527c6a3e420f4f8d9385ab210bc69ca152da6e3458c3b1c0e9"


def _json_digest(coco):
    return hashlib.sha256(json.dumps(coco, sort_keys=True).encode()).hexdigest()


def _images_digest(images):
    digest = hashlib.sha256()
    for file_name in sorted(images):
        digest.update(f"{file_name}{images[file_name].shape}".encode())
        digest.update(images[file_name].tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def scenes():
    return generate_scenes(16, seed=0)


def _masks_by_image(coco):
    masks = {image["id"]: [] for image in coco["images"]}
    for ann in coco["annotations"]:
        masks[ann["image_id"]].append(mask_utils.decode(ann["segmentation"]).astype(bool))
    return masks


def test_same_seed_same_bits_on_every_machine(scenes):
    coco, images = scenes
    assert _json_digest(coco) == SCENES_JSON_SHA256
    assert _images_digest(images) == SCENES_IMAGES_SHA256


def test_seed_changes_the_scenes():
    coco_a, images_a = generate_scenes(3, seed=1)
    coco_b, images_b = generate_scenes(3, seed=1)
    coco_c, images_c = generate_scenes(3, seed=2)
    assert _json_digest(coco_a) == _json_digest(coco_b)
    assert _images_digest(images_a) == _images_digest(images_b)
    assert _json_digest(coco_a) != _json_digest(coco_c)
    assert _images_digest(images_a) != _images_digest(images_c)


def test_images_match_their_entries(scenes):
    coco, images = scenes
    assert len(coco["images"]) == len(images) == 16
    for entry in coco["images"]:
        image = images[entry["file_name"]]
        assert image.dtype == np.uint8
        assert image.shape == (entry["height"], entry["width"], 3)
        assert 320 <= entry["height"] <= 640 and 320 <= entry["width"] <= 640
    assert len({images[e["file_name"]].shape for e in coco["images"]}) > 1


def test_annotations_are_exact_coco_records(scenes):
    coco, _ = scenes
    masks = iter(m for per_image in _masks_by_image(coco).values() for m in per_image)
    for ann in coco["annotations"]:
        mask = next(masks)
        assert ann["iscrowd"] == 0
        assert ann["area"] == mask.sum() > 0
        rows, cols = np.nonzero(mask)
        x, y = cols.min(), rows.min()
        assert ann["bbox"] == [x, y, cols.max() + 1 - x, rows.max() + 1 - y]
    assert {a["category_id"] for a in coco["annotations"]} == set(range(1, len(CATEGORIES) + 1))
    areas = [a["area"] for a in coco["annotations"]]
    assert min(areas) < 200 and max(areas) > 20_000  # small and large objects alike


def test_instance_masks_do_not_overlap(scenes):
    coco, _ = scenes
    for per_image in _masks_by_image(coco).values():
        if per_image:
            assert np.sum(per_image, axis=0).max() == 1


def test_scenes_load_through_the_dataset_path(scenes):
    coco, images = scenes
    dataset = load_dataset("scenes")
    assert dataset.num_annotations == len(coco["annotations"])
    assert (dataset.crowd_skipped, dataset.empty_skipped) == (0, 0)
    assert dataset.categories == {i + 1: name for i, name in enumerate(CATEGORIES)}
    for sample in dataset.samples:
        assert np.array_equal(sample.image, images[sample.file_name])
        for ann in sample.annotations:
            x, y = ann.point
            assert ann.mask[int(y), int(x)]
    assert len(load_dataset("scenes", limit=4).samples) == 4
