"""What a COCO instances file must hold, checked before pycocotools reads it.

pycocotools trusts its input: a missing key is a KeyError deep in createIndex, a duplicate
annotation id silently replaces one annotation by another (one is then evaluated twice, the
other never), an annotation of an unknown image is dropped, and a malformed compressed RLE
decodes to whatever memory held. Every record is checked here first, in one pass of plain
Python (val2017's 36k annotations take well under a second), and the first problem found is a
DataError naming the file, the record and what a valid one looks like.
"""

from __future__ import annotations

import math

from samfast.transforms import preview


class DataError(ValueError):
    """Annotation or image data that cannot be evaluated; the message names the file, the item and the fix."""


def check_coco(dataset, source: str) -> None:
    """Refuse a COCO dict that pycocotools would crash on or silently misread. `source` names the file."""
    if not isinstance(dataset, dict):
        raise DataError(f"{source}: the top level must be a JSON object with 'images' and 'annotations', "
                        f"got {_json_type(dataset)}")
    for key in ("images", "annotations"):
        if not isinstance(dataset.get(key), list):
            what = "no" if key not in dataset else f"{_json_type(dataset[key])} as"
            raise DataError(f"{source} has {what} {key!r}: a COCO instances file holds a list of {key}")
    categories = dataset.get("categories", [])
    if not isinstance(categories, list):
        raise DataError(f"{source} has {_json_type(categories)} as 'categories': a COCO instances file holds a "
                        "list of categories (or none)")
    for i, category in enumerate(categories):
        where = f"{source}: categories[{i}]"
        _record(category, where)
        _integer(category, "id", where)
        if not isinstance(category.get("name"), str):
            raise DataError(f"{where} needs a 'name' string, got {category.get('name')!r}")

    sizes: dict[int, tuple[int, int]] = {}  # image id -> (height, width)
    for image_id, image in _records_by_unique_id(dataset, "images", "image", source):
        where = f"{source}: image id {image_id}"
        name = image.get("file_name")
        if not isinstance(name, str) or not name:
            raise DataError(f"{where} needs a 'file_name' string (the image file in the image folder), got {name!r}")
        sizes[image_id] = (_integer(image, "height", where, minimum=1), _integer(image, "width", where, minimum=1))

    for ann_id, ann in _records_by_unique_id(dataset, "annotations", "annotation", source):
        where = f"{source}: annotation id {ann_id}"
        image_id = _integer(ann, "image_id", where)
        if image_id not in sizes:
            raise DataError(f"{where} belongs to image id {image_id}, which is not in 'images'")
        _integer(ann, "category_id", where)
        if ann.get("iscrowd", 0) not in (0, 1) or type(ann.get("iscrowd", 0)) is not int:
            raise DataError(f"{where}: iscrowd must be 0 or 1, got {ann['iscrowd']!r}")
        if "segmentation" not in ann:
            raise DataError(f"{where} has no 'segmentation' (polygons or RLE)")
        _check_segmentation(ann["segmentation"], sizes[image_id], where)


def _check_segmentation(segmentation, size: tuple[int, int], where: str) -> None:
    if isinstance(segmentation, list):
        if not segmentation:
            raise DataError(f"{where}: segmentation is an empty list of polygons")
        for j, polygon in enumerate(segmentation):
            if not isinstance(polygon, list) or not all(_is_number(v) for v in polygon):
                raise DataError(f"{where}: polygon {j} must be a list of finite numbers x1, y1, x2, y2, ..., "
                                f"got {preview(polygon)}")
            if len(polygon) < 6 or len(polygon) % 2:
                raise DataError(f"{where}: polygon {j} has {len(polygon)} numbers; a polygon is x, y pairs of at "
                                "least 3 points (an even count, 6 or more)")
        return
    if not isinstance(segmentation, dict):
        raise DataError(f"{where}: segmentation must be a list of polygons or an RLE object, "
                        f"got {_json_type(segmentation)}")
    rle_size = segmentation.get("size")
    if not (isinstance(rle_size, list) and [type(v) for v in rle_size] == [int, int] and rle_size == list(size)):
        raise DataError(f"{where}: RLE size {rle_size!r} is not its image's [height, width] {list(size)}")
    counts = segmentation.get("counts")
    if isinstance(counts, str):
        counts = _compressed_counts(counts, where)
    elif not (isinstance(counts, list) and all(type(c) is int and c >= 0 for c in counts)):
        raise DataError(f"{where}: RLE counts must be a compressed string or a list of non-negative integers, "
                        f"got {preview(counts)}")
    if sum(counts) != size[0] * size[1]:
        raise DataError(f"{where}: RLE counts cover {sum(counts)} pixels, its {size[1]}x{size[0]} image has "
                        f"{size[0] * size[1]}; the mask is truncated or belongs to another image")


def _compressed_counts(text: str, where: str) -> list[int]:
    """The run lengths of pycocotools' compressed RLE string (its rleFrString, which checks nothing):
    6-bit groups offset by 48, 5 data bits each, bit 0x20 = more groups follow, 0x10 in the last
    one = negative; from the third run on, each value is a difference to the run two before."""
    counts: list[int] = []
    position = 0
    while position < len(text):
        value = shift = 0
        more = True
        while more:
            if position == len(text) or not 48 <= ord(text[position]) < 48 + 64:
                raise DataError(f"{where}: RLE counts is not a valid compressed RLE string")
            group = ord(text[position]) - 48
            value |= (group & 0x1F) << shift
            more = bool(group & 0x20)
            position += 1
            shift += 5
            if not more and group & 0x10:
                value -= 1 << shift
        if len(counts) > 2:
            value += counts[-2]
        if value < 0:
            raise DataError(f"{where}: RLE counts decodes to a negative run length")
        counts.append(value)
    return counts


def _records_by_unique_id(dataset: dict, key: str, kind: str, source: str):
    """(id, record) of each object in dataset[key], refusing a non-object, a bad id or a repeated id."""
    positions: dict[int, int] = {}
    for i, record in enumerate(dataset[key]):
        where = f"{source}: {key}[{i}]"
        _record(record, where)
        record_id = _integer(record, "id", where)
        if record_id in positions:
            raise DataError(f"{source}: {kind} id {record_id} appears twice ({key}[{positions[record_id]}] and "
                            f"{key}[{i}]); {kind} ids must be unique")
        positions[record_id] = i
        yield record_id, record


def _record(value, where: str) -> None:
    if not isinstance(value, dict):
        raise DataError(f"{where} must be a JSON object, got {_json_type(value)}")


def _integer(record: dict, key: str, where: str, minimum: int | None = None) -> int:
    if key not in record:
        raise DataError(f"{where} has no {key!r}")
    value = record[key]
    if type(value) is not int or (minimum is not None and value < minimum):  # bool and 1.0 are not ids
        bound = f" >= {minimum}" if minimum is not None else ""
        raise DataError(f"{where}: {key} must be an integer{bound}, got {value!r}")
    return value


def _is_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _json_type(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
             bool: "a boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)
