"""SAM 3's concept-segmentation metric cgF1 at one score threshold, computed as Meta's reference computes it.

Reference: facebookresearch/sam3 at commit 99d02f28c8d34610ab35559b72642b01f10fdb1e, file
sam3/eval/cgf1_eval.py (class CGF1Eval; the sam3==0.1.4 wheel ships the same code, reformatted, two lines
earlier). It builds on pycocotools 2.0.11's COCOeval (cocoeval.py). Each rule below and where it comes from:

* One item is one (image, noun phrase) pair (CGF1Eval docstring, lines 189-192).
* Predictions are kept when score >= threshold, so a score exactly at the threshold counts (lines 254-255).
* Crowd ground truth is dropped before anything else: COCOeval._prepare sets ignore = iscrowd (cocoeval.py
  line 109) and evaluateImg keeps only the non-ignored ones (lines 251-252, 291). A prediction on a crowd
  region is therefore a false positive, and a pair with only crowd masks is a negative pair.
* Image level (lines 256-266, 268-282, 334-337): no GT and no kept prediction is a true negative, GT without
  kept predictions a false negative, kept predictions without GT a false positive, both a true positive.
* Matching (lines 294-296): one to one by scipy's linear_sum_assignment on -IoU (the assignment of largest
  summed IoU, not a greedy one), IoU from pycocotools.mask.iou on the RLEs (lines 237-239).
* A matched pair is a true positive at IoU threshold t when IoU >= t; unmatched predictions are false
  positives, unmatched GT false negatives (lines 300-303), for t in pycocotools' 0.5:0.95 step 0.05
  (np.linspace(.5, .95, 10), cocoeval.py line 506).
* Positive micro F1 sums TP and FN over every pair but FP over positive pairs only: the pairs with GT, the
  only ones given "local_positive_F1s" (lines 279-280, 340-341, 383-395, 404, 409-414). Pairs with neither
  GT nor predictions add nothing to it.
* precision = TP / (TP + FP + 1e-4), recall = TP / (TP + FN + 1e-4), F1 = 2PR / (P + R + 1e-4): the
  epsilons are kept, so a perfect prediction scores slightly under 100 (lines 404, 406, 409-414).
* IL_MCC = (TP*TN - FP*FN) / (sqrt of the four margins' product + 1e-6), which is 0 when a margin is empty,
  e.g. when every pair is positive (lines 420-429).
* cgF1 = positive micro F1 x IL_MCC per IoU threshold (line 449), then averaged over the ten thresholds like
  every metric with iou_threshold None (lines 34, 470-477; the s > -1 filter there never drops a value,
  since |F1 x MCC| < 1). The reference reports a fraction; `cgf1` here is x 100, the paper's scale.

Not covered: the reference's multi-annotator "oracle" mode (several GT files, best per pair) and its
selection of pairs flagged is_instance_exhaustive (lines 576-591); callers pass only the pairs to score.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pycocotools.mask as mask_utils
from scipy.optimize import linear_sum_assignment

# pycocotools' own expression, so the thresholds are the same floats (0.8999999999999999, not 0.9).
IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True)


@dataclass(frozen=True)
class PhraseItem:
    """One (image, noun phrase) pair: GT and predicted masks as COCO RLE dicts ({"size": [h, w], "counts"})."""

    gt_masks: Sequence[Mapping]
    pred_masks: Sequence[Mapping]
    pred_scores: Sequence[float]
    gt_crowd: Sequence[bool] = field(default=())  # empty: no crowd masks


@dataclass(frozen=True)
class CgF1Result:
    """cgf1 on the paper's 0-100 scale; pmf1 and il_mcc are fractions. tp/fp/fn hold one count per IoU
    threshold (iou_thresholds); fp counts only predictions on pairs with GT, the ones pmF1 sees."""

    cgf1: float
    pmf1: float
    il_mcc: float
    tp: tuple[int, ...]
    fp: tuple[int, ...]
    fn: tuple[int, ...]
    il_tp: int
    il_fp: int
    il_tn: int
    il_fn: int
    iou_thresholds: tuple[float, ...]

    def as_dict(self) -> dict:
        return asdict(self)


def _keep_prediction(score: float, threshold: float) -> bool:
    return score >= threshold


def _match(ious: np.ndarray) -> np.ndarray:
    """IoUs of the one-to-one matching of largest summed IoU (rows: predictions, columns: GT)."""
    rows, cols = linear_sum_assignment(-ious)
    return ious[rows, cols]


def _as_item(item: PhraseItem | Mapping, index: int) -> PhraseItem:
    if not isinstance(item, PhraseItem):
        try:
            item = PhraseItem(**item)
        except TypeError as error:
            raise ValueError(f"item {index}: not a PhraseItem nor a mapping of its fields: {error}") from None
    if len(item.pred_scores) != len(item.pred_masks):
        raise ValueError(f"item {index}: {len(item.pred_scores)} scores for {len(item.pred_masks)} predicted masks")
    if item.gt_crowd and len(item.gt_crowd) != len(item.gt_masks):
        raise ValueError(f"item {index}: {len(item.gt_crowd)} crowd flags for {len(item.gt_masks)} GT masks")
    if not all(math.isfinite(s) for s in item.pred_scores):
        raise ValueError(f"item {index}: non-finite prediction score")
    sizes = set()
    for rle in [*item.gt_masks, *item.pred_masks]:
        if not isinstance(rle, Mapping) or "size" not in rle or "counts" not in rle:
            raise ValueError(f"item {index}: masks must be COCO RLE dicts with 'size' and 'counts'")
        sizes.add(tuple(rle["size"]))
    # pycocotools returns IoU -1 for masks of different sizes instead of failing.
    if len(sizes) > 1:
        raise ValueError(f"item {index}: masks of different sizes in one pair: {sorted(sizes)}")
    return item


def compute_cgf1(items: Iterable[PhraseItem | Mapping], threshold: float = 0.5) -> CgF1Result:
    """cgF1 of predictions over (image, phrase) pairs; mappings with PhraseItem's field names are accepted."""
    n_thr = len(IOU_THRESHOLDS)
    tp, fp, fn = (np.zeros(n_thr, dtype=np.int64) for _ in range(3))
    il_tp = il_fp = il_tn = il_fn = 0
    n_items = 0
    for index, raw in enumerate(items):
        item = _as_item(raw, index)
        n_items += 1
        crowd = item.gt_crowd or [False] * len(item.gt_masks)
        gt = [m for m, c in zip(item.gt_masks, crowd) if not c]
        dt = [m for m, s in zip(item.pred_masks, item.pred_scores) if _keep_prediction(s, threshold)]
        if not gt:
            # Negative pair: image level only; its predictions never reach pmF1's counts.
            if dt:
                il_fp += 1
            else:
                il_tn += 1
            continue
        if not dt:
            il_fn += 1
            fn += len(gt)
            continue
        il_tp += 1
        ious = np.asarray(mask_utils.iou(list(dt), list(gt), [0] * len(gt)), dtype=np.float64)
        matched = _match(ious)
        hits = (matched[None, :] >= IOU_THRESHOLDS[:, None]).sum(axis=1)
        tp += hits
        fp += len(dt) - hits
        fn += len(gt) - hits
    if n_items == 0:
        # A gate that scored nothing must not pass on a default value.
        raise ValueError("no (image, phrase) items to score")

    precision = tp / (tp + fp + 1e-4)
    recall = tp / (tp + fn + 1e-4)
    pmf1_per_thr = 2 * precision * recall / (precision + recall + 1e-4)
    margins = float(il_tp + il_fp) * float(il_tp + il_fn) * float(il_tn + il_fp) * float(il_tn + il_fn)
    il_mcc = float(il_tp * il_tn - il_fp * il_fn) / (margins**0.5 + 1e-6)
    return CgF1Result(
        cgf1=100.0 * float(np.mean(pmf1_per_thr * il_mcc)),
        pmf1=float(np.mean(pmf1_per_thr)),
        il_mcc=il_mcc,
        tp=tuple(int(v) for v in tp),
        fp=tuple(int(v) for v in fp),
        fn=tuple(int(v) for v in fn),
        il_tp=il_tp,
        il_fp=il_fp,
        il_tn=il_tn,
        il_fn=il_fn,
        iou_thresholds=tuple(float(t) for t in IOU_THRESHOLDS),
    )
