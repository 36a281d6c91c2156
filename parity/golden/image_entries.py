"""A golden content file of per-image entries, gzipped JSON (segment everything's masks, the concept task's
(image, phrase) pairs):

    {"images": [{"image_id", <the image's described fields>, <items>: [item, ...]}, ...]}

The bytes are reproducible: images in id order, sorted keys, compact separators, no NaN, gzip with mtime 0 and
no file name. decode() refuses any other shape, naming the file and the command that rewrites it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from parity.golden.store import GoldenCorrupt


def encode(images: Mapping[int, list], described: Mapping[int, dict], items: str) -> bytes:
    """The file's bytes: per image id its described fields (file_name, height, width) and its `items` list."""
    entries = [{"image_id": image_id, **described[image_id], items: listed} for image_id, listed in sorted(images.items())]
    text = json.dumps({"images": entries}, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def decode(data: bytes, path: Path, regenerate: str, items: str,
           item_problem: Callable[[object], str | None]) -> dict[int, list]:
    """image id -> its `items` list; item_problem(item) says what is wrong with one item ("a mask record without
    exactly the keys ..."), or None."""
    def corrupt(problem: str) -> GoldenCorrupt:
        return GoldenCorrupt(f"golden file {path} {problem}. Regenerate the golden with:\n  {regenerate}")

    try:
        payload = json.loads(gzip.decompress(data))
    except (OSError, EOFError, ValueError) as err:
        raise corrupt(f"is not gzip-compressed JSON ({err})") from err
    if not isinstance(payload, dict) or not isinstance(payload.get("images"), list):
        raise corrupt("has no 'images' list")
    images = {}
    for entry in payload["images"]:
        listed = entry.get(items) if isinstance(entry, dict) else None
        if not isinstance(listed, list) or not isinstance(entry.get("image_id"), int):
            raise corrupt(f"has an image entry without an integer image_id and a {items} list")
        for item in listed:
            if problem := item_problem(item):
                raise corrupt(f"has {problem} in image {entry['image_id']}")
        images[entry["image_id"]] = listed
    return images
