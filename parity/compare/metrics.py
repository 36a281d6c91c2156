"""Accuracy metrics of the gate: mask and box IoU, logits error, mIoU vs ground truth.

Everything returns plain Python floats so results go straight into reports and JSON manifests.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two XYWH boxes (COCO's bbox; segment everything's NMS boxes, as x0, y0, x0 + w, y0 + h)."""
    width = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
    height = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
    inter = max(0.0, width) * max(0.0, height)
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks of the same shape.

    Two empty masks agree perfectly (1.0): a golden that found nothing and a stage that finds
    nothing is not a regression. Non-boolean input is refused rather than thresholded, because
    passing logits here by mistake would silently count every non-zero logit as foreground.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"mask shapes differ: {a.shape} vs {b.shape}")
    if a.dtype != np.bool_ or b.dtype != np.bool_:
        raise TypeError(f"masks must be boolean, got {a.dtype} and {b.dtype}; threshold logits first")
    union = np.count_nonzero(a | b)
    if union == 0:
        return 1.0
    return np.count_nonzero(a & b) / union


@dataclass(frozen=True)
class IouSummary:
    """Distribution of per-annotation IoUs: the mean hides a few broken masks, p5/min/n_below_half show them."""

    mean: float
    p5: float
    min: float
    count: int
    n_below_half: int


def summarize_ious(ious: Sequence[float]) -> IouSummary:
    """Summary of per-annotation IoUs; p5 is numpy's linearly interpolated 5th percentile."""
    values = np.asarray(ious, dtype=np.float64)
    if values.size == 0:
        # A gate that compared nothing must not pass.
        raise ValueError("no IoUs to summarize: the comparison produced no masks")
    return IouSummary(
        mean=float(values.mean()),
        p5=float(np.percentile(values, 5)),
        min=float(values.min()),
        count=int(values.size),
        n_below_half=int(np.count_nonzero(values < 0.5)),
    )


def logits_error(pred: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """How far predicted logits are from reference logits, computed in float64.

    rel_l2 = ||pred - ref|| / ||ref||, cosine similarity of the flattened arrays, max_abs = the
    largest absolute difference. A NaN or inf on either side gives rel_l2 = max_abs = inf and
    cosine = -1, values that fail any threshold, instead of NaNs that compare False and can pass
    a check written as `not error > limit`.
    """
    pred = np.asarray(pred, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if pred.shape != ref.shape:
        raise ValueError(f"logits shapes differ: {pred.shape} vs {ref.shape}")
    if not (np.isfinite(pred).all() and np.isfinite(ref).all()):
        return {"rel_l2": float("inf"), "cosine": -1.0, "max_abs": float("inf")}
    diff_norm = float(np.linalg.norm(pred - ref))
    ref_norm = float(np.linalg.norm(ref))
    pred_norm = float(np.linalg.norm(pred))
    if ref_norm == 0.0:
        # No scale to be relative to: only an exact match is error-free.
        rel_l2 = 0.0 if diff_norm == 0.0 else float("inf")
    else:
        rel_l2 = diff_norm / ref_norm
    if ref_norm == 0.0 or pred_norm == 0.0:
        cosine = 1.0 if ref_norm == pred_norm else 0.0
    else:
        cosine = float(np.dot(pred.ravel(), ref.ravel())) / (pred_norm * ref_norm)
    max_abs = float(np.abs(pred - ref).max()) if pred.size else 0.0
    return {"rel_l2": rel_l2, "cosine": cosine, "max_abs": max_abs}


def miou_vs_ground_truth(records: Iterable[tuple[int, float]]) -> dict:
    """Mean IoU against ground-truth masks, overall and per category.

    records are (category_id, iou) pairs, one per annotation. Returns
    {"mean": float, "count": int, "per_category": {category_id: {"mean": float, "count": int}}}
    with categories in ascending id order.
    """
    by_category: dict[int, list[float]] = defaultdict(list)
    for category_id, iou in records:
        by_category[int(category_id)].append(float(iou))
    if not by_category:
        raise ValueError("no (category_id, iou) records: nothing was evaluated")
    everything = [iou for ious in by_category.values() for iou in ious]
    return {
        "mean": float(np.mean(everything)),
        "count": len(everything),
        "per_category": {
            category_id: {"mean": float(np.mean(ious)), "count": len(ious)}
            for category_id, ious in sorted(by_category.items())
        },
    }
