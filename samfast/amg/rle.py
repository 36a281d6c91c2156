"""Run-length encoding of many masks at once, in the COCO (pycocotools) layout.

Encoding happens on the masks' device: the masks are flattened column-major (COCO's order), the
change points are found with one comparison of neighbours and one nonzero, and only those change
points travel to the host. Runs are then cut with numpy per mask; no Python loop walks over runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class ChangePoints:
    """The device-side result of encoding N masks of H x W (still on the device until fetched)."""

    size: tuple[int, int]
    first_value: torch.Tensor  # (N,) bool: the value of each mask's first pixel (column-major)
    changes: torch.Tensor  # (K, 2) int64 rows (mask, i): pixel i differs from pixel i + 1, sorted


def change_points(masks: torch.Tensor) -> ChangePoints:
    """Encode (N, H, W) bool masks. The nonzero's count is data-dependent: one host-device sync."""
    n, h, w = masks.shape
    flat = masks.transpose(1, 2).reshape(n, h * w)
    return ChangePoints((h, w), flat[:, 0], torch.nonzero(flat[:, 1:] != flat[:, :-1]))


def uncompressed_rles(first_value: np.ndarray, changes: np.ndarray, size: tuple[int, int]) -> list[dict]:
    """pycocotools' uncompressed RLE dicts ({"size": [h, w], "counts": [...]}) from fetched change points.

    counts alternate runs of 0 and 1 starting with 0 (a leading 0-length run when the first pixel is set).
    """
    h, w = size
    n = len(first_value)
    per_mask = np.bincount(changes[:, 0], minlength=n) if len(changes) else np.zeros(n, dtype=np.int64)
    ends = np.split(changes[:, 1] + 1, np.cumsum(per_mask)[:-1])
    rles = []
    for starts_one, boundaries in zip(first_value, ends):
        counts = np.diff(np.concatenate([[0], boundaries, [h * w]]))
        prefix = [0] if starts_one else []
        rles.append({"size": [h, w], "counts": prefix + counts.tolist()})
    return rles


def rle_area(rle: dict) -> int:
    return int(sum(rle["counts"][1::2]))


def rle_to_mask(rle: dict) -> np.ndarray:
    """(H, W) bool mask of an uncompressed RLE."""
    h, w = rle["size"]
    counts = np.asarray(rle["counts"], dtype=np.int64)
    values = np.arange(len(counts)) % 2 == 1
    return np.repeat(values, counts).reshape(w, h).T


def coco_rle(rle: dict) -> dict:
    """Compressed COCO RLE ({"size", "counts": str}) of an uncompressed one, JSON-serialisable."""
    from pycocotools import mask as mask_utils

    h, w = rle["size"]
    encoded = mask_utils.frPyObjects(rle, h, w)
    return {"size": list(encoded["size"]), "counts": encoded["counts"].decode("utf-8")}
