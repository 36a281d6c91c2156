"""COCO-format evaluation data through pycocotools, with the prompts of the published SAM evaluation.

Real COCO files (coco-mini, val2017) and the generated scenes go through one path: the dataset
dict is handed to a pycocotools COCO object, and images come from a reader by file name (a
folder on disk, or the scenes held in memory). Masks and images are decoded only when a sample
is read, so pointing at val2017 (36k annotations) costs an index, not gigabytes of masks.

Bad data is a DataError naming the file and the item, never a traceback from pycocotools or PIL:
the whole annotation file is checked up front (parity.golden.coco_format), image paths are confined to
the image folder, and each image is checked as it is read (decodable, of a known value range,
of the size its annotations say).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from parity.golden.coco_format import DataError, check_coco
from parity.golden.scenes import generate_scenes
from parity.golden.settings import DATA_ENV, DataNotFoundError, dataset_dir
from samfast import transforms

__all__ = ["DataError", "DataNotFoundError", "Dataset", "Sample", "load_coco", "load_dataset"]

# Recorded in fingerprints and manifests: changing how prompts are made changes what a golden means.
PROMPT_POLICY = "centre-point-v1"  # centre of mass if inside the mask, else the point farthest from its edge
BOX_POLICY = "box-v1"  # tight pixel box of the mask, xyxy with exclusive x1, y1

SCENES_IMAGES = 16  # the embedded "scenes" dataset is generate_scenes(SCENES_IMAGES, seed=0)

_FIX = (
    "pass --coco-root (the folder of image files) and --ann-file (the COCO annotation json), "
    f"or set {DATA_ENV} to the folder that holds coco-mini/"
)


@dataclass(frozen=True)
class Annotation:
    """One instance with its prompts. point is (x, y) and box (x0, y0, x1, y1), in pixels."""

    ann_id: int
    image_id: int
    category_id: int
    mask: np.ndarray  # bool HxW
    point: tuple[float, float]
    box: tuple[float, float, float, float]


@dataclass(frozen=True)
class Sample:
    image_id: int
    file_name: str
    image: np.ndarray  # uint8 HxWx3 RGB
    annotations: list[Annotation]


class SampleList(Sequence):
    """The dataset's images in ascending id order; each Sample is built when it is read."""

    def __init__(self, coco: COCO, image_ids: list[int], ann_ids: dict[int, list[int]],
                 read_image: Callable[[str], np.ndarray]):
        self._coco, self._image_ids, self._ann_ids, self._read_image = coco, image_ids, ann_ids, read_image

    def __len__(self) -> int:
        return len(self._image_ids)

    @property
    def file_names(self) -> list[str]:
        return [self._coco.imgs[i]["file_name"] for i in self._image_ids]

    @property
    def image_ids(self) -> list[int]:
        return list(self._image_ids)

    @property
    def annotation_counts(self) -> list[int]:
        """Annotations each image will carry, known from the index without reading an image."""
        return [len(self._ann_ids[i]) for i in self._image_ids]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        info = self._coco.imgs[self._image_ids[index]]
        try:
            image = self._read_image(info["file_name"])
        except DataError as err:
            raise DataError(f"image id {info['id']}: {err}") from None
        if image.shape[:2] != (info["height"], info["width"]):
            raise DataError(
                f"image id {info['id']}: {info['file_name']} is {image.shape[1]}x{image.shape[0]} but its "
                f"annotations say {info['width']}x{info['height']}: the annotation file does not match the images"
            )
        annotations = []
        for ann_id in self._ann_ids[info["id"]]:
            ann = self._coco.anns[ann_id]
            mask = self._coco.annToMask(ann).astype(bool)
            annotations.append(Annotation(ann_id, info["id"], ann["category_id"], mask,
                                          centre_point(mask), mask_box(mask)))
        return Sample(info["id"], info["file_name"], image, annotations)


@dataclass(frozen=True)
class Dataset:
    """An evaluation set: lazily read samples plus what identifies and describes them."""

    name: str
    fingerprint: str  # sha256 of annotations, selected images, limit and prompt policies
    samples: SampleList
    categories: dict[int, str]
    num_annotations: int  # annotations the samples will carry
    crowd_skipped: int
    empty_skipped: int  # annotations whose mask has no pixel at this resolution
    limit: int | None

    def manifest(self) -> dict:
        """What a golden or report records about the data it ran on (JSON-serialisable)."""
        return {
            "dataset": self.name,
            "fingerprint": self.fingerprint,
            "images": len(self.samples),
            "annotations": self.num_annotations,
            "crowd_skipped": self.crowd_skipped,
            "empty_skipped": self.empty_skipped,
            "limit": self.limit,
            "prompt_policy": PROMPT_POLICY,
            "box_policy": BOX_POLICY,
        }


def load_dataset(name_or_path: str | Path, *, limit: int | None = None) -> Dataset:
    """A dataset by name ("coco-mini" under the data folder, "scenes" generated in memory, "scenes:N"
    N generated scenes, e.g. scenes:1000 to measure scaling) or a folder laid out like coco-mini:
    annotations/<one .json> and images/."""
    if str(name_or_path) == "scenes" or str(name_or_path).startswith("scenes:"):
        name, count = _scenes_count(str(name_or_path))
        coco_dict, images = generate_scenes(count, seed=0)
        # The images dict is the only copy: hand out copies so a caller cannot alter later reads.
        return index_dataset(name, json.dumps(coco_dict, sort_keys=True).encode(), lambda f: images[f].copy(), limit)
    folder = dataset_dir("coco-mini") if name_or_path == "coco-mini" else Path(name_or_path)
    if not folder.is_dir():
        raise DataNotFoundError(f"{name_or_path!r} is neither a known dataset (coco-mini, scenes) nor a folder")
    ann_files = sorted((folder / "annotations").glob("*.json"))
    if len(ann_files) != 1:
        raise DataNotFoundError(
            f"expected exactly one annotation json in {folder / 'annotations'}, found {len(ann_files)}; {_FIX}"
        )
    return load_coco(folder / "images", ann_files[0], limit=limit, name=folder.name)


def _scenes_count(spec: str) -> tuple[str, int]:
    """("scenes", 16) for the embedded set, ("scenes<N>", N) for "scenes:N"; the first images of
    scenes:N are the embedded set's (one random stream, drawn in image order)."""
    if spec == "scenes":
        return "scenes", SCENES_IMAGES
    count = spec.removeprefix("scenes:")
    if not count.isdigit() or int(count) < 1:
        raise DataError(f"--data {spec}: the number of generated scenes must be a positive integer, e.g. scenes:1000")
    return f"scenes{int(count)}", int(count)


def load_coco(coco_root: str | Path, ann_file: str | Path, *, limit: int | None = None,
              name: str | None = None) -> Dataset:
    """COCO data from disk: coco_root is the folder of image files (e.g. coco/val2017), ann_file
    the annotation json (e.g. coco/annotations/instances_val2017.json). limit keeps the first
    limit images in ascending id order, the same subset on every machine."""
    coco_root, ann_file = Path(coco_root), Path(ann_file)
    if not coco_root.is_dir():
        raise DataNotFoundError(f"image folder {coco_root} does not exist; {_FIX}")
    if not ann_file.is_file():
        raise DataNotFoundError(f"annotation file {ann_file} does not exist or is not a file; {_FIX}")
    try:
        json_bytes = ann_file.read_bytes()
    except OSError as err:
        raise DataError(f"annotation file {ann_file} cannot be read: {err.strerror}") from None
    dataset = index_dataset(name or ann_file.stem, json_bytes,
                            lambda f: _read_rgb(_image_path(coco_root, f, ann_file)), limit, source=str(ann_file))
    missing = [f for f in dataset.samples.file_names if not _image_path(coco_root, f, ann_file).is_file()]
    if missing:
        raise DataNotFoundError(
            f"{len(missing)} image file(s) named in {ann_file} are not in {coco_root}, "
            f"e.g. {coco_root / missing[0]}; {_FIX}"
        )
    return dataset


def _image_path(coco_root: Path, file_name: str, ann_file: Path) -> Path:
    """The image file of `file_name`, which must resolve inside the image folder: `../x.jpg`, an
    absolute path or a symlink out of the folder would read files the user never pointed us at."""
    path = (coco_root / file_name).resolve()
    if not path.is_relative_to(coco_root.resolve()):
        raise DataError(
            f"{ann_file}: file_name {file_name!r} resolves to {path}, outside the image folder {coco_root}; "
            "file names must be paths inside --coco-root (no '..', no absolute paths, no links out)"
        )
    return path


def _read_rgb(path: Path) -> np.ndarray:
    try:
        return transforms.read_image(path)
    except transforms.InputError as err:  # the caller adds the image id
        raise DataError(str(err)) from None


def index_dataset(name: str, json_bytes: bytes, read_image: Callable[[str], np.ndarray], limit: int | None,
                  source: str | None = None) -> Dataset:
    """The one loading path: check and index the annotations, select images, skip crowd and empty masks.
    `source` names the annotations in errors (the file; by default the dataset's name)."""
    source = source or f"dataset {name!r}"
    if limit is not None and limit < 1:
        raise DataError(f"limit must be a positive number of images or None, got {limit}")
    try:
        coco_dict = json.loads(json_bytes)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        raise DataError(f"{source} is not valid JSON: {err}") from None
    check_coco(coco_dict, source)
    coco = COCO()
    coco.dataset = coco_dict
    with contextlib.redirect_stdout(io.StringIO()):  # createIndex prints progress lines
        coco.createIndex()
    image_ids = sorted(coco.imgs)[:limit]
    ann_ids: dict[int, list[int]] = {}
    crowd = empty = 0
    for image_id in image_ids:
        ann_ids[image_id] = []
        for ann in sorted(coco.imgToAnns[image_id], key=lambda a: a["id"]):
            if ann.get("iscrowd", 0):
                crowd += 1  # crowd regions cover many instances: no single prompt selects them
            elif mask_utils.area(coco.annToRLE(ann)) == 0:
                empty += 1  # e.g. a sub-pixel polygon: nothing to prompt or to score
            else:
                ann_ids[image_id].append(ann["id"])
    digest = hashlib.sha256(json_bytes)
    digest.update(json.dumps({"image_ids": image_ids, "limit": limit, "prompt_policy": PROMPT_POLICY,
                              "box_policy": BOX_POLICY}, sort_keys=True).encode())
    return Dataset(
        name=name,
        fingerprint=digest.hexdigest(),
        samples=SampleList(coco, image_ids, ann_ids, read_image),
        categories={c["id"]: c["name"] for c in coco.dataset.get("categories", [])},
        num_annotations=sum(len(ids) for ids in ann_ids.values()),
        crowd_skipped=crowd,
        empty_skipped=empty,
        limit=limit,
    )


def mask_box(mask: np.ndarray) -> tuple[float, float, float, float]:
    """Tight box of a non-empty mask as (x0, y0, x1, y1) with x1 = last column + 1 (exclusive),
    the convention of COCO's xywh boxes of pixel masks (x1 = x + w)."""
    cols = np.flatnonzero(mask.any(axis=0))
    rows = np.flatnonzero(mask.any(axis=1))
    if cols.size == 0:
        raise ValueError("an empty mask has no box")
    return float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)


def centre_point(mask: np.ndarray) -> tuple[float, float]:
    """The single point prompt of the published SAM evaluation, as (x, y) pixel indices.

    The pixel holding the mask's centre of mass when that pixel is foreground; otherwise (rings,
    crescents, split occluded objects) the foreground pixel farthest, in Euclidean distance, from
    the nearest background pixel or the image border; ties go to the first in row-major order.
    Coordinates are whole pixel indices: SAM's prompt encoder adds 0.5 to reach the pixel centre.
    """
    mask = np.asarray(mask, dtype=bool)
    rows, cols = np.nonzero(mask)
    if rows.size == 0:
        raise ValueError("an empty mask has no centre point")
    # Exact integer sums and one rounded division: the same pixel on every machine.
    y = int(np.floor(rows.sum() / rows.size + 0.5))
    x = int(np.floor(cols.sum() / cols.size + 0.5))
    if mask[y, x]:
        return float(x), float(y)
    x0, y0, x1, y1 = (int(v) for v in mask_box(mask))
    # One background pixel of padding all round makes the image border count as an edge.
    crop = np.pad(mask[y0:y1, x0:x1], 1)
    distance = _squared_distance_to_background(crop)
    y, x = np.unravel_index(np.argmax(distance), distance.shape)
    return float(x0 + x - 1), float(y0 + y - 1)


def _squared_distance_to_background(mask: np.ndarray) -> np.ndarray:
    """Exact squared Euclidean distance from every pixel to the nearest False pixel (one must exist).

    Separable, with numpy only (scipy is not a dependency): distance within each column first,
    then the row pass min over x' of (x - x')^2 + column_distance(x')^2, which costs rows * cols^2,
    so it runs along the shorter side.
    """
    if mask.shape[1] > mask.shape[0]:
        return _squared_distance_to_background(mask.T).T
    height, width = mask.shape
    column = np.where(mask, height + width, 0).astype(np.int64)
    for y in range(1, height):
        np.minimum(column[y], column[y - 1] + 1, out=column[y])
    for y in range(height - 2, -1, -1):
        np.minimum(column[y], column[y + 1] + 1, out=column[y])
    column_sq = column**2
    offsets_sq = (np.arange(width)[:, None] - np.arange(width)[None, :]) ** 2
    rows_per_chunk = max(1, 2**22 // (width * width))  # bounds the (rows, width, width) temporary
    result = np.empty_like(column_sq)
    for start in range(0, height, rows_per_chunk):
        chunk = column_sq[start : start + rows_per_chunk]
        result[start : start + rows_per_chunk] = (chunk[:, None, :] + offsets_sq[None]).min(axis=2)
    return result
