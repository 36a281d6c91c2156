"""Gate a stage's detections against the concept golden, per [concept.<precision>] in budgets.toml.

Per (image, phrase) pair, detections are matched one to one by their decoder query: SAM 3's DETR decoder
answers each phrase with a fixed set of queries, and query q of any stage is the same question as query q of
the golden, so a pair is never ambiguous (mask IoU could not pair seeded weights' look-alike masks, and a
stage that moved a detection to another query has changed the model). A golden detection the stage did not
keep is *lost*, one the stage kept and the golden did not is *new*. Both sides record every query's score,
kept or not, so each count change is judged by the score that decided it: when the query's score moved by no
more than the stage's score tolerance (max_score_abs_err) and crossed the confidence threshold, rounding alone
may have carried it across: *near the decision*, counted, not failed. Any other count change means a score
moved by more than the tolerance, which the score error (over every query of every pair) fails, and counts
with IoU 0 in the headline, the mean mask IoU over the union of both sides; the matched pairs' mask IoU and
box IoU and each pair's presence error are gated beside it. On seeded weights the masks mean nothing: their
figures are reported, and the scores, the presence and every count change away from the threshold are gated.
No pair is left out of any figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pycocotools import mask as mask_utils

from parity.compare.gates import Gate, StageResult
from parity.compare.metrics import box_iou

WORST_PAIRS = 5


@dataclass(frozen=True)
class Matched:
    query: int
    iou: float  # mask IoU
    box_iou: float


@dataclass(frozen=True)
class PairMatch:
    """One (image, phrase): its detections on both sides, paired by query."""

    image_id: int
    phrase: str
    golden_count: int
    stage_count: int
    matched: tuple[Matched, ...]
    lost: tuple[int, ...]  # golden queries the stage did not keep
    new: tuple[int, ...]  # stage queries the golden did not keep
    lost_near_decision: int  # lost, their query's score within the tolerance of the golden's
    new_near_decision: int
    score_err: float  # over every query, kept or not
    presence_err: float

    @property
    def union(self) -> int:
        """The detections the union mean counts: every one but those near the threshold."""
        return len(self.matched) + len(self.lost) - self.lost_near_decision + len(self.new) - self.new_near_decision

    @property
    def union_iou_mean(self) -> float:
        # neither side kept anything (or only near the threshold): they agree
        return sum(m.iou for m in self.matched) / self.union if self.union else 1.0


def _xywh(box: Sequence[float]) -> list[float]:
    return [box[0], box[1], box[2] - box[0], box[3] - box[1]]


def _mask_iou(a: dict, b: dict) -> float:
    if a["size"] != b["size"]:
        raise ValueError(f"masks of sizes {a['size']} and {b['size']}: golden and stage ran on other images")
    return float(mask_utils.iou([a], [b], [0])[0][0])


def match_pair(image_id: int, golden: dict, stage: dict, score_tolerance: float) -> PairMatch:
    """Pair one (image, phrase)'s stage detections with the golden's by query."""
    if golden["phrase"] != stage["phrase"] or len(golden["query_scores"]) != len(stage["query_scores"]):
        raise ValueError(f"image {image_id}: the golden asked {golden['phrase']!r} of {len(golden['query_scores'])} "
                         f"queries where the stage asked {stage['phrase']!r} of {len(stage['query_scores'])}: another "
                         "question; regenerate the golden")
    gold = {d["query"]: d for d in golden["detections"]}
    ours = {d["query"]: d for d in stage["detections"]}
    score_errors = np.abs(np.asarray(stage["query_scores"]) - np.asarray(golden["query_scores"]))
    matched = tuple(Matched(q, _mask_iou(ours[q]["segmentation"], gold[q]["segmentation"]),
                            box_iou(_xywh(ours[q]["box"]), _xywh(gold[q]["box"])))
                    for q in sorted(gold.keys() & ours.keys()))
    lost, new = sorted(gold.keys() - ours.keys()), sorted(ours.keys() - gold.keys())
    return PairMatch(image_id, golden["phrase"], len(gold), len(ours), matched, tuple(lost), tuple(new),
                     lost_near_decision=sum(score_errors[q] <= score_tolerance for q in lost),
                     new_near_decision=sum(score_errors[q] <= score_tolerance for q in new),
                     score_err=float(score_errors.max(initial=0.0)),
                     presence_err=abs(stage["presence"] - golden["presence"]))


@dataclass(frozen=True)
class ConceptSummary:
    """A stage's figures over every (image, phrase) pair."""

    pairs: int
    golden_detections: int
    stage_detections: int
    matched: int
    lost: int
    new: int
    lost_near_decision: int
    new_near_decision: int
    count_changed_pairs: int  # pairs whose number of detections differs from the golden's
    union_iou_mean: float  # matched IoUs over matched + lost + new but those near the threshold
    matched_iou_mean: float  # NaN when nothing matched (fails any gate)
    matched_iou_p5: float
    box_iou_p5: float
    score_max_abs_err: float  # over every query of every pair
    presence_max_abs_err: float
    worst: list[dict]  # of the pairs that lost or gained a detection or matched one below IoU 1, the
    # WORST_PAIRS of lowest union mean

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(matches: Sequence[PairMatch]) -> ConceptSummary:
    if not any(m.golden_count or m.stage_count for m in matches):
        raise ValueError("neither the golden nor the stage kept a single detection: there is nothing to compare")
    union = sum(m.union for m in matches)
    pairs = [p for m in matches for p in m.matched]
    ious = np.array([p.iou for p in pairs], dtype=np.float64)
    nan = math.nan
    imperfect = [m for m in matches if m.lost or m.new or m.union_iou_mean < 1.0]
    worst = sorted(imperfect, key=lambda m: (m.union_iou_mean, -m.union, m.image_id, m.phrase))[:WORST_PAIRS]
    return ConceptSummary(
        pairs=len(matches),
        golden_detections=sum(m.golden_count for m in matches),
        stage_detections=sum(m.stage_count for m in matches),
        matched=len(pairs),
        lost=sum(len(m.lost) for m in matches),
        new=sum(len(m.new) for m in matches),
        lost_near_decision=sum(m.lost_near_decision for m in matches),
        new_near_decision=sum(m.new_near_decision for m in matches),
        count_changed_pairs=sum(m.golden_count != m.stage_count for m in matches),
        union_iou_mean=float(ious.sum()) / union if union else nan,
        matched_iou_mean=float(ious.mean()) if pairs else nan,
        matched_iou_p5=float(np.percentile(ious, 5)) if pairs else nan,
        box_iou_p5=float(np.percentile([p.box_iou for p in pairs], 5)) if pairs else nan,
        score_max_abs_err=max(m.score_err for m in matches),
        presence_max_abs_err=max(m.presence_err for m in matches),
        worst=[{"image_id": m.image_id, "phrase": m.phrase, "union_iou_mean": m.union_iou_mean,
                "golden_detections": m.golden_count, "stage_detections": m.stage_count,
                "lost": len(m.lost), "new": len(m.new), "lost_near_decision": m.lost_near_decision,
                "new_near_decision": m.new_near_decision, "presence_err": m.presence_err,
                "matched": [[p.query, p.iou] for p in m.matched], "lost_queries": list(m.lost),
                "new_queries": list(m.new)} for m in worst],
    )


def gates(summary: ConceptSummary, limits: Mapping[str, float], masks_meaningful: bool) -> list[Gate]:
    """Seeded weights' masks and boxes mean nothing (logits near 0, where bf16 rounding moves many pixels): their
    IoUs are reported, not gated, and every count change away from the threshold fails instead."""
    counted = [Gate("count_changes_off_threshold", summary.lost - summary.lost_near_decision + summary.new
                    - summary.new_near_decision, 0, "max", True)] if not masks_meaningful else []
    return [
        Gate("union_iou_mean", summary.union_iou_mean, limits["min_union_iou_mean"], "min", masks_meaningful),
        Gate("matched_iou_mean", summary.matched_iou_mean, limits["min_matched_iou_mean"], "min", masks_meaningful),
        Gate("matched_iou_p5", summary.matched_iou_p5, limits["min_matched_iou_p5"], "min", masks_meaningful),
        Gate("box_iou_p5", summary.box_iou_p5, limits["min_box_iou_p5"], "min", masks_meaningful),
        Gate("score_max_abs_err", summary.score_max_abs_err, limits["max_score_abs_err"], "max", True),
        Gate("presence_max_abs_err", summary.presence_max_abs_err, limits["max_presence_abs_err"], "max", True),
        *counted,
    ]


def compare(stage: str, outputs: Mapping[int, Sequence[dict]], golden: Mapping[int, Sequence[dict]],
            limits: Mapping[str, float], masks_meaningful: bool = True) -> StageResult:
    """Match each (image, phrase) pair's stage detections to the golden's and gate the figures (the masks'
    only with masks_meaningful: trained weights, not seeded ones)."""
    if set(outputs) != set(golden):
        return StageResult(stage, [], {}, error=(
            f"the stage ran on images {sorted(outputs)} but the golden has {sorted(golden)}: "
            "different data; regenerate the golden"))
    matches = []
    for image_id in sorted(golden):
        if len(outputs[image_id]) != len(golden[image_id]):
            return StageResult(stage, [], {}, error=(
                f"image {image_id}: the stage asked {len(outputs[image_id])} phrases, the golden "
                f"{len(golden[image_id])}: other phrases; regenerate the golden"))
        matches += [match_pair(image_id, g, s, limits["max_score_abs_err"])
                    for g, s in zip(golden[image_id], outputs[image_id])]
    summary = summarize(matches)
    figures = summary.as_dict()
    worst = figures.pop("worst")
    return StageResult(stage, gates(summary, limits, masks_meaningful), figures, worst)
