"""Where the generator looks: the point grid of each crop layer and the crop boxes (host-side, tiny).

The same numbers as segment_anything.utils.amg (build_all_layer_point_grids, generate_crop_boxes):
tests/unit/test_amg.py holds them equal, since the record order and the crop NMS depend on them.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np


def point_grid(n_per_side: int) -> np.ndarray:
    """(n*n, 2) points (x, y) evenly spaced in [0, 1]^2, cell centres, row by row."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs = np.tile(side[None, :], (n_per_side, 1))
    ys = np.tile(side[:, None], (1, n_per_side))
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def layer_point_grids(n_per_side: int, n_layers: int, downscale: int) -> list[np.ndarray]:
    """One grid per crop layer; layer i has n_per_side / downscale**i points per side."""
    return [point_grid(int(n_per_side / downscale**i)) for i in range(n_layers + 1)]


def crop_boxes(image_size: tuple[int, int], n_layers: int, overlap_ratio: float) -> list[tuple[list[int], int]]:
    """[(x0, y0, x1, y1), layer] for the whole image (layer 0), then (2**i)**2 overlapping crops per layer i."""
    im_h, im_w = image_size
    boxes = [([0, 0, im_w, im_h], 0)]
    for layer in range(1, n_layers + 1):
        n_side = 2**layer
        overlap = int(overlap_ratio * min(im_h, im_w) * (2 / n_side))
        crop_w = int(math.ceil((overlap * (n_side - 1) + im_w) / n_side))
        crop_h = int(math.ceil((overlap * (n_side - 1) + im_h) / n_side))
        xs = [int((crop_w - overlap) * i) for i in range(n_side)]
        ys = [int((crop_h - overlap) * i) for i in range(n_side)]
        boxes += [([x0, y0, min(x0 + crop_w, im_w), min(y0 + crop_h, im_h)], layer) for x0, y0 in product(xs, ys)]
    return boxes
