import json

import numpy as np
import pytest
from PIL import Image

from parity.golden.data import BOX_POLICY, PROMPT_POLICY, centre_point, load_coco, load_dataset, mask_box
from parity.golden.settings import DataNotFoundError

# sha256 of coco-mini's annotation json, all 21 images and the prompt policies: the same on
# every machine; it changes only when the data or the prompt policy changes (then update it).
COCO_MINI_FINGERPRINT = "4cfc84753f5f94def1a03a0e7cd50bc63837756588c3c49f22214644bb13bea5"


@pytest.fixture(scope="module")
def coco_mini_dir(data_root):
    return data_root / "coco-mini"


@pytest.fixture(scope="module")
def coco_mini(coco_mini_dir):
    return load_coco(coco_mini_dir / "images", coco_mini_dir / "annotations" / "instances_mini.json",
                     name="coco-mini")


@pytest.fixture(scope="module")
def coco_mini_samples(coco_mini):
    return list(coco_mini.samples)


def test_coco_mini_counts(coco_mini_dir, coco_mini, coco_mini_samples):
    raw = json.loads((coco_mini_dir / "annotations" / "instances_mini.json").read_text())
    assert len(raw["annotations"]) == 217
    assert sum(a["iscrowd"] for a in raw["annotations"]) == 1
    assert coco_mini.crowd_skipped == 1
    assert coco_mini.empty_skipped == 0  # the smallest real mask still has 19 pixels
    assert coco_mini.num_annotations == 216
    assert sum(len(s.annotations) for s in coco_mini_samples) == 216
    assert len(coco_mini_samples) == 21
    assert len(coco_mini.categories) == 80


def test_coco_mini_samples_are_well_formed(coco_mini_samples):
    image_ids = [s.image_id for s in coco_mini_samples]
    assert image_ids == sorted(image_ids)
    for sample in coco_mini_samples:
        assert sample.image.dtype == np.uint8 and sample.image.ndim == 3 and sample.image.shape[2] == 3
        assert sample.image.flags.writeable  # torch.from_numpy warns on read-only arrays
        for ann in sample.annotations:
            assert ann.image_id == sample.image_id
            assert ann.mask.dtype == bool and ann.mask.shape == sample.image.shape[:2]
            x, y = ann.point
            assert x == int(x) and y == int(y)
            assert ann.mask[int(y), int(x)], f"point of annotation {ann.ann_id} is outside its mask"
            x0, y0, x1, y1 = (int(v) for v in ann.box)
            assert ann.mask[y0:y1, x0:x1].sum() == ann.mask.sum()  # box holds the whole mask...
            assert ann.mask[y0].any() and ann.mask[y1 - 1].any()  # ...and is tight
            assert ann.mask[:, x0].any() and ann.mask[:, x1 - 1].any()


def test_coco_mini_by_name_matches_explicit_paths(coco_mini):
    by_name = load_dataset("coco-mini")
    assert by_name.fingerprint == coco_mini.fingerprint == COCO_MINI_FINGERPRINT
    assert by_name.manifest() == {
        "dataset": "coco-mini", "fingerprint": COCO_MINI_FINGERPRINT, "images": 21, "annotations": 216,
        "crowd_skipped": 1, "empty_skipped": 0, "limit": None,
        "prompt_policy": PROMPT_POLICY, "box_policy": BOX_POLICY,
    }


def test_limit_takes_the_first_images_by_id(coco_mini, coco_mini_samples):
    first5 = load_dataset("coco-mini", limit=5)
    assert [s.image_id for s in first5.samples] == [s.image_id for s in coco_mini_samples[:5]]
    assert first5.num_annotations == sum(len(s.annotations) for s in coco_mini_samples[:5])
    assert load_dataset("coco-mini", limit=5).fingerprint == first5.fingerprint
    assert first5.fingerprint != coco_mini.fingerprint
    assert load_dataset("coco-mini", limit=6).fingerprint != first5.fingerprint
    with pytest.raises(ValueError):
        load_dataset("coco-mini", limit=0)


def test_missing_folder_names_path_and_fix(tmp_path):
    with pytest.raises(DataNotFoundError, match="--coco-root") as err:
        load_coco(tmp_path / "val2017", tmp_path / "instances_val2017.json")
    assert str(tmp_path / "val2017") in str(err.value)
    (tmp_path / "val2017").mkdir()
    with pytest.raises(DataNotFoundError, match="--ann-file") as err:
        load_coco(tmp_path / "val2017", tmp_path / "instances_val2017.json")
    assert str(tmp_path / "instances_val2017.json") in str(err.value)
    with pytest.raises(DataNotFoundError, match="neither a known dataset"):
        load_dataset(tmp_path / "nowhere")


def _square(x0, y0, x1, y1):
    return [[x0, y0, x1, y0, x1, y1, x0, y1]]


@pytest.fixture
def tiny_coco(tmp_path):
    """A coco-mini-style folder: a grayscale and an RGBA image, one crowd and one sub-pixel annotation."""
    (tmp_path / "images").mkdir()
    (tmp_path / "annotations").mkdir()
    Image.new("L", (12, 10), 128).save(tmp_path / "images" / "gray.png")
    Image.new("RGBA", (12, 10), (10, 20, 30, 40)).save(tmp_path / "images" / "rgba.png")
    images = [{"id": 7, "file_name": "rgba.png", "height": 10, "width": 12},
              {"id": 3, "file_name": "gray.png", "height": 10, "width": 12}]
    annotations = [
        {"id": 1, "image_id": 3, "category_id": 1, "segmentation": _square(2, 2, 8, 6), "iscrowd": 0},
        {"id": 2, "image_id": 3, "category_id": 1, "segmentation": _square(0, 0, 12, 10), "iscrowd": 1},
        {"id": 3, "image_id": 7, "category_id": 1, "segmentation": _square(1.1, 1.1, 1.2, 1.2), "iscrowd": 0},
        {"id": 4, "image_id": 7, "category_id": 1, "segmentation": _square(0, 0, 4, 4), "iscrowd": 0},
    ]
    coco = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "thing"}]}
    (tmp_path / "annotations" / "instances_tiny.json").write_text(json.dumps(coco))
    return tmp_path


def test_folder_layout_converts_images_and_skips(tiny_coco):
    dataset = load_dataset(tiny_coco)
    assert [s.image_id for s in dataset.samples] == [3, 7]
    assert (dataset.crowd_skipped, dataset.empty_skipped, dataset.num_annotations) == (1, 1, 2)
    gray, rgba = dataset.samples
    assert gray.image.shape == rgba.image.shape == (10, 12, 3)
    assert (gray.image == 128).all()
    assert (rgba.image == [10, 20, 30]).all()
    assert [a.ann_id for a in gray.annotations] == [1]
    assert [a.ann_id for a in rgba.annotations] == [4]


def test_missing_image_file_is_named(tiny_coco):
    (tiny_coco / "images" / "rgba.png").unlink()
    with pytest.raises(DataNotFoundError, match="rgba.png"):
        load_dataset(tiny_coco)


def test_image_size_must_match_annotations(tiny_coco):
    Image.new("RGB", (10, 12)).save(tiny_coco / "images" / "gray.png")
    with pytest.raises(ValueError, match="gray.png is 10x12 but its annotations say 12x10"):
        load_dataset(tiny_coco).samples[0]


def test_mask_box_is_tight_with_exclusive_end():
    mask = np.zeros((8, 10), dtype=bool)
    mask[2:5, 3:7] = True
    assert mask_box(mask) == (3.0, 2.0, 7.0, 5.0)


def test_centre_point_uses_centre_of_mass_when_inside():
    mask = np.zeros((9, 11), dtype=bool)
    mask[1:6, 2:9] = True  # centre of mass (x, y) = (5, 3)
    assert centre_point(mask) == (5.0, 3.0)


def test_centre_point_falls_back_to_farthest_from_edge():
    ring = np.zeros((11, 11), dtype=bool)
    ring[1:10, 1:10] = True
    ring[3:8, 3:8] = False  # a square ring 2 pixels thick: the centre of mass is in the hole
    x, y = centre_point(ring)
    assert ring[int(y), int(x)]
    # The ring's inner corners are sqrt(2) from the hole and 2 from the outside, every other ring
    # pixel 1 from an edge; of the four corners, the first in row-major order wins.
    assert (x, y) == (2.0, 2.0)


def test_centre_point_counts_the_image_border_as_edge():
    mask = np.ones((7, 7), dtype=bool)
    mask[3, 3] = False  # centre of mass is the hole
    # Ignoring the border, the corners (3 px diagonal from the hole) would win; with it,
    # the best distance is 2, first reached at (1, 1).
    assert centre_point(mask) == (1.0, 1.0)


def test_empty_mask_has_no_prompts():
    empty = np.zeros((4, 4), dtype=bool)
    with pytest.raises(ValueError):
        centre_point(empty)
    with pytest.raises(ValueError):
        mask_box(empty)
