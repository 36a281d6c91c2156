"""The DAVIS region and boundary measures of a video mask against a reference: J (region IoU, which is
parity.compare.metrics.mask_iou) and F (boundary F-measure).

F as the DAVIS benchmark defines it (Perazzi et al. 2016, davis2017-evaluation's f_measure): each mask's
boundary is the set of pixels whose right, lower or lower-right neighbour differs (seg2bmap on a mask
of the image's size); a boundary pixel counts as matched when the other boundary lies within
ceil(BOUND_TH x image diagonal) pixels (a disk); precision and recall are the matched shares of the
stage's and the reference's boundary pixels, F their harmonic mean. Two empty boundaries agree (F = 1),
one empty and one not is F = 0. numpy only (no scipy or OpenCV in the gate's dependencies).
"""

from __future__ import annotations

import math

import numpy as np

BOUND_TH = 0.008  # DAVIS's tolerance, a share of the image diagonal


def boundary(mask: np.ndarray) -> np.ndarray:
    """seg2bmap at the mask's own size: a pixel differing from its right, lower or lower-right neighbour."""
    mask = np.asarray(mask, dtype=bool)
    right, below, diagonal = (np.zeros_like(mask) for _ in range(3))
    right[:, :-1] = mask[:, 1:]
    below[:-1, :] = mask[1:, :]
    diagonal[:-1, :-1] = mask[1:, 1:]
    edges = (mask ^ right) | (mask ^ below) | (mask ^ diagonal)
    edges[-1, :] = mask[-1, :] ^ right[-1, :]  # DAVIS: the last row and column compare along themselves only
    edges[:, -1] = mask[:, -1] ^ below[:, -1]
    edges[-1, -1] = False
    return edges


def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """mask dilated by a disk of `radius` pixels (one shifted OR per offset in the disk)."""
    out = mask.copy()
    height, width = mask.shape
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            if (dy or dx) and dy * dy + dx * dx <= radius * radius:
                out[max(dy, 0):height + min(dy, 0), max(dx, 0):width + min(dx, 0)] |= \
                    mask[max(-dy, 0):height + min(-dy, 0), max(-dx, 0):width + min(-dx, 0)]
    return out


def boundary_f(mask: np.ndarray, reference: np.ndarray, bound_th: float = BOUND_TH) -> float:
    """DAVIS's F of `mask` against `reference` (bool arrays of one shape)."""
    if mask.shape != reference.shape:
        raise ValueError(f"mask shapes differ: {mask.shape} vs {reference.shape}")
    radius = math.ceil(bound_th * math.hypot(*mask.shape))
    ours, theirs = boundary(mask), boundary(reference)
    n_ours, n_theirs = int(ours.sum()), int(theirs.sum())
    if n_ours == 0 and n_theirs == 0:
        return 1.0
    if n_ours == 0 or n_theirs == 0:
        return 0.0
    precision = np.count_nonzero(ours & dilate(theirs, radius)) / n_ours
    recall = np.count_nonzero(theirs & dilate(ours, radius)) / n_theirs
    return 0.0 if precision + recall == 0 else 2.0 * precision * recall / (precision + recall)
