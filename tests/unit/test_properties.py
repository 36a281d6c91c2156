"""Property-based layer (hypothesis): whatever the predictor or the COCO loader is given, the answer
is a result of the right shape or one of the project's clear errors (InputError, DataError), never
an exception from inside torch, PIL or pycocotools.

Fixed seed (derandomize) and no example database: every run tries the same examples, so a failure
is reproducible and no run is flaky. The ViT encoder is replaced by a pooling stand-in (the real
one takes seconds per image on the CI CPU): its input is always a (B, 3, 1024, 1024) batch, whatever
the image, which the stand-in asserts for every example; the real encoder on odd sizes is
tests/unit/test_predictor.py's. Everything around it (conversion, resizing, prompt checks, the
prompt encoder, the mask decoder, upscaling to the original size) is the real code.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from pycocotools import mask as mask_utils
from torch import nn

import samfast
from parity.golden.coco_format import _compressed_counts
from parity.golden.data import DataError, DataNotFoundError, load_coco
from samfast import InputError, Prompts

PROPERTIES = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class PooledEncoder(nn.Module):
    """Stand-in for the ViT: 256 channels of the 16x16-pooled input, so the decoder sees the image."""

    img_size = 1024

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        assert images.shape[1:] == (3, 1024, 1024), images.shape
        return F.avg_pool2d(images, 16).mean(1, keepdim=True).expand(-1, 256, -1, -1).contiguous()


def _predictor(stages: str) -> samfast.SamPredictor:
    model = samfast.build_sam("vit_tiny", device="cpu", stages=stages)
    model.image_encoder = PooledEncoder()
    return samfast.SamPredictor(model)


@pytest.fixture(scope="module")
def predictor():
    return _predictor("fp32")


@pytest.fixture(scope="module")
def nested_predictor():
    return _predictor("fp32+nt")


# --- valid inputs, built to be valid: every one must give a result of the right shape -------------
sides = st.integers(1, 48) | st.sampled_from([1, 2, 700])
strips = st.sampled_from([(1, 3000), (3000, 1), (2, 2500)])  # the short side rounds to 0 in the reference
channels = st.sampled_from([None, 1, 3, 4])  # None: HxW grayscale


@st.composite
def images(draw):
    (h, w), c = draw(st.tuples(sides, sides) | strips), draw(channels)
    shape = (h, w) if c is None else (h, w, c)
    return np.random.default_rng(draw(st.integers(0, 99))).integers(0, 256, shape, dtype=np.uint8)


@st.composite
def valid_prompts(draw, h: int, w: int, kind: str, k: int):
    """0..3 prompts of `kind` (points, boxes or both), k points each, inside the image."""
    n = draw(st.integers(0, 3))
    x = st.floats(0, w, allow_nan=False)
    y = st.floats(0, h, allow_nan=False)
    coords = labels = boxes = None
    if kind in ("points", "both"):
        coords = np.array([[[draw(x), draw(y)] for _ in range(k)] for _ in range(n)]).reshape(n, k, 2)
        labels = np.array([[draw(st.sampled_from([0, 1])) for _ in range(k)] for _ in range(n)]).reshape(n, k)
    if kind in ("boxes", "both"):
        corners = [sorted([draw(x), draw(x)]) + sorted([draw(y), draw(y)]) for _ in range(n)]
        boxes = np.array([[x0, y0, x1, y1] for x0, x1, y0, y1 in corners]).reshape(n, 4)
    return Prompts(point_coords=coords, point_labels=labels, boxes=boxes)


@st.composite
def valid_batches(draw):
    batch = draw(st.lists(images(), max_size=3))
    kind, k = draw(st.sampled_from(["points", "boxes", "both"])), draw(st.integers(1, 3))  # one kind: nt needs it
    return batch, [draw(valid_prompts(*image.shape[:2], kind, k)) for image in batch]


def _check_shapes(results, batch, prompts, outputs: int) -> None:
    assert len(results) == len(batch)
    for result, image, prompt in zip(results, batch, prompts):
        n = len(prompt)
        assert result.masks.shape == (n, outputs, *image.shape[:2]) and result.masks.dtype == torch.bool
        assert result.iou_predictions.shape == (n, outputs) and result.iou_predictions.dtype == torch.float32
        assert result.low_res_logits.shape == (n, outputs, 256, 256)
        assert torch.isfinite(result.low_res_logits).all() and torch.isfinite(result.iou_predictions).all()


@settings(PROPERTIES, max_examples=12)  # the slowest: two decoder passes per image
@given(valid_batches(), st.booleans())
def test_valid_batches_give_results_of_the_right_shape(predictor, nested_predictor, inputs, multimask):
    batch, prompts = inputs
    results = predictor.predict_batch(batch, prompts, multimask_output=multimask)
    _check_shapes(results, batch, prompts, 3 if multimask else 1)
    # The jagged (nt) path, with images of no prompts mixed in, decodes the same masks as the loop.
    for nested, loop in zip(nested_predictor.predict_batch(batch, prompts, multimask_output=multimask), results):
        torch.testing.assert_close(nested.low_res_logits, loop.low_res_logits, rtol=0, atol=1e-4)


# --- anything at all: a result or an InputError ---------------------------------------------------
junk_arrays = st.one_of(
    st.none(),
    st.sampled_from([[], [[]], "text", [[["a", 1]]], [[[1, 2]], [[3]]], float("nan")]),
    st.builds(lambda shape, fill: np.full(shape, fill),
              st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple),
              st.sampled_from([0, 1, -1, 7, 0.7, 5.0, 1e9, -3.0, np.nan, np.inf])),
)
junk_images = st.one_of(
    images(),
    st.builds(lambda shape, dtype: np.ones(shape, dtype=dtype),
              st.sampled_from([(4, 5), (4, 5, 3), (4, 5, 2), (4, 5, 5), (0, 5, 3), (4,), (2, 4, 5, 3)]),
              st.sampled_from([np.uint8, np.uint16, np.float32, np.float64, np.bool_, np.int64])),
    st.sampled_from([None, "image.png", [[1, 2], [3]]]),
)


@st.composite
def junk_prompts(draw):
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([None, {"boxes": [[0, 0, 1, 1]]}, 3]))
    return Prompts(point_coords=draw(junk_arrays), point_labels=draw(junk_arrays), boxes=draw(junk_arrays))


@PROPERTIES
@given(st.lists(junk_images, max_size=2), st.lists(junk_prompts(), max_size=2))
def test_any_batch_gives_a_result_or_an_input_error(predictor, batch, prompts):
    try:
        results = predictor.predict_batch(batch, prompts)
    except InputError:
        return
    _check_shapes(results, [np.asarray(image) for image in batch], prompts, 3)


@PROPERTIES
@given(images(), junk_arrays, junk_arrays, junk_arrays, st.sampled_from([None, np.zeros((1, 256, 256)), np.zeros((3, 3))]))
def test_predict_gives_a_result_or_an_input_error(predictor, image, coords, labels, box, mask_input):
    predictor.set_image(image)
    try:
        masks, iou, low_res = predictor.predict(coords, labels, box, mask_input)
    except InputError:
        return
    assert masks.shape == (3, *image.shape[:2]) and iou.shape == (3,) and low_res.shape == (3, 256, 256)


# --- the COCO loader: malformed records built from a valid base -------------------------------------
def _base() -> dict:
    square = [2, 2, 8, 2, 8, 6, 2, 6]
    return {
        "images": [{"id": 1, "file_name": "a.png", "height": 10, "width": 12},
                   {"id": 2, "file_name": "b.png", "height": 10, "width": 12}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "segmentation": [square], "iscrowd": 0},
            {"id": 2, "image_id": 2, "category_id": 1, "iscrowd": 0,
             "segmentation": {"size": [10, 12], "counts": [30, 20, 70]}},
            {"id": 3, "image_id": 2, "category_id": 1, "iscrowd": 1, "segmentation": [square]},
        ],
        "categories": [{"id": 1, "name": "thing"}],
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 200) | st.floats(allow_nan=True) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(st.sampled_from(["size", "counts", "id"]), inner, max_size=2),
    max_leaves=8,
)


@st.composite
def malformed(draw):
    """The base with 1 to 3 edits: a key deleted or set to any JSON value, a record duplicated or
    replaced, a polygon or RLE altered, or the whole file replaced."""
    coco = _base()
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):  # mostly one edit: one defect, not the first of many
        edit = draw(st.sampled_from(["delete", "set", "duplicate", "replace record", "polygon", "rle", "file", "top"]))
        section = {"polygon": "annotations", "rle": "annotations", "file": "images"}.get(edit) or draw(
            st.sampled_from(["images", "annotations", "categories"]))
        records = coco.get(section) if isinstance(coco, dict) else None
        if edit == "top" or not isinstance(records, list) or not records:
            coco = draw(json_values) if edit == "top" else coco
            continue
        index = draw(st.integers(0, len(records) - 1))
        record = records[index]
        if edit == "duplicate":
            records.append(json.loads(json.dumps(record)))
        elif edit == "replace record":
            records[index] = draw(json_values)
        elif not isinstance(record, dict):
            continue
        elif edit == "polygon":
            record["segmentation"] = draw(st.lists(st.lists(st.integers(-2, 14) | st.floats(allow_nan=True), max_size=9), max_size=2)
                                          | st.fixed_dictionaries({"size": json_values, "counts": st.text(max_size=6) | json_values}))
        elif edit == "rle":  # well formed and not empty, but of any size and total
            h, w = draw(st.integers(1, 12)), draw(st.integers(1, 14))
            start = draw(st.integers(0, h * w - 1))
            length = draw(st.integers(1, h * w - start))
            tail = h * w - start - length + draw(st.sampled_from([0, 0, -1, 2]))
            record["segmentation"] = {"size": [h, w], "counts": [start, length, tail]}
        elif edit == "file":
            record["file_name"] = draw(st.sampled_from(["../a.png", "/etc/hostname", "", "missing.png", "b.png"]))
        elif edit == "delete" and record:
            record.pop(draw(st.sampled_from(sorted(record))))
        elif edit == "set":
            key = draw(st.sampled_from(sorted(record) + ["id"]))
            record[key] = draw(json_values)
    return coco


@pytest.fixture(scope="module")
def coco_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coco")
    (folder / "images").mkdir()
    for name in ("a.png", "b.png"):
        Image.new("RGB", (12, 10), (40, 80, 120)).save(folder / "images" / name)
    return folder


def _load_all(folder, coco) -> list:
    (folder / "instances.json").write_text(json.dumps(coco))
    return list(load_coco(folder / "images", folder / "instances.json").samples)


def test_the_base_loads(coco_folder):
    """The control for the property below: unedited, the base gives every non-crowd annotation."""
    assert [[a.ann_id for a in s.annotations] for s in _load_all(coco_folder, _base())] == [[1], [2]]


@settings(PROPERTIES, max_examples=150)
@given(malformed())
def test_malformed_coco_gives_samples_or_a_data_error(coco_folder, coco):
    try:
        samples = _load_all(coco_folder, coco)
    except (DataError, DataNotFoundError) as err:
        assert str(coco_folder / "instances.json") in str(err) or "image id" in str(err)
        return
    for sample in samples:
        for ann in sample.annotations:
            assert ann.mask.shape == sample.image.shape[:2] and ann.mask.any()


@PROPERTIES
@given(st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_compressed_rle_counts_equal_the_run_lengths(h, w, seed):
    """The loader's own reading of pycocotools' compressed strings (which pycocotools never checks)
    against the run lengths of the mask itself, in column-major order starting with a 0-run."""
    mask = np.random.default_rng(seed).random((h, w)) < np.random.default_rng(seed + 1).random()
    text = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode()
    runs, value = [0], False
    for pixel in mask.flatten(order="F"):
        if pixel != value:
            runs.append(0)
            value = pixel
        runs[-1] += 1
    assert _compressed_counts(text, "test") == runs
