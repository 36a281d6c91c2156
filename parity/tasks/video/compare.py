"""The video task's comparison: a stage's tracks against the golden's, per clip, object and frame.

Per object and frame: J (region IoU, parity.compare.metrics.mask_iou) and F (DAVIS boundary F,
parity.compare.boundary) against the golden's mask, and the same against the ground truth (information:
seeded weights do not segment). Summaries: J&F = (J + F) / 2, mean and worst; per object its mean;
drift = mean J of an object's last frames minus mean J of its first, over the frames where the golden has
the object (tracking that decays shows here first; frames empty on both sides would count J 1), and
J against the frame index (the mean over clips and objects: the report plots it);
objects lost = object-frames where the golden has the object and the stage's J is below 0.5. The worst
object-frame's two masks go with the result, for its picture (parity/tasks/video/runner.py).
Gated, per [video.<precision>] in parity/budgets.toml: J&F vs golden (mean, worst) and objects lost when
the weights segment (as the point task gates masks), and the drift too over the objects present on at least
40 frames, where the issue's two 10-frame windows lie apart (a short track's quarters of a few frames are
reported only); the logits of the kept frames and the object
score logits always: with seeded weights they are what moves (masks of seeded weights are mostly
"absent" after the prompted frame, so mask gates alone would pass a broken memory).
"""

from __future__ import annotations

import numpy as np

from parity.compare.boundary import boundary_f
from parity.compare.gates import WORST_SHOWN, Gate, StageResult
from parity.compare.metrics import logits_error, mask_iou
from parity.golden.videos import Clip
from parity.tasks.video.produce import ClipOutputs

LOST_J = 0.5


def object_score_error(ours: np.ndarray, golden: np.ndarray) -> float:
    """The largest |ours - golden| / max(|golden|, 1) over the object-frames of a clip: the absolute error
    where the golden's score is within 1 of the "absent" decision at 0 (seeded weights' scores are all
    there, 0.4-0.7 on the gate's clip, so for them this is the absolute error), relative to the score
    above that (a trained tracker's run to +19, where bf16 rounding alone moves them by 0.1). NaN on both
    sides (no output on that frame) is agreement; NaN on one side is the largest error."""
    both_nan = np.isnan(ours) & np.isnan(golden)
    diff = np.abs(np.where(both_nan, 0.0, ours - golden)) / np.maximum(np.abs(np.nan_to_num(golden)), 1.0)
    return float(np.nan_to_num(diff, nan=np.inf).max())


DRIFT_FRAMES = 10  # the video target's "no drift": the mean J of the last 10 frames within 0.01 of the first 10's


def drift_gated(num_frames: int) -> bool:
    """A track long enough for the drift's two ends to be DRIFT_FRAMES each, a quarter of it at most."""
    return num_frames >= 4 * DRIFT_FRAMES


def _edge_frames(num_frames: int) -> int:
    """How many frames the drift compares at each end: DRIFT_FRAMES, or a quarter of a track shorter than
    4 x DRIFT_FRAMES (the two ends never overlap), at least one."""
    return max(1, min(DRIFT_FRAMES, num_frames // 4))


def object_drift(rows: list[dict]) -> tuple[float, int] | None:
    """One object's rows of a clip, in frame order -> (its drift, the frames the golden has it on); None
    where the golden never has it."""
    js = [r["j"] for r in rows if r["golden_present"]]
    if not js:
        return None
    k = _edge_frames(len(js))
    return float(np.mean(js[-k:]) - np.mean(js[:k])), len(js)


def per_object_frame(ours: ClipOutputs, golden: ClipOutputs, clip: Clip) -> list[dict]:
    rows = []
    for o in range(golden.masks.shape[0]):
        for t in range(golden.masks.shape[1]):
            stage_mask, golden_mask, truth = ours.masks[o, t], golden.masks[o, t], clip.masks[o, t]
            j, f = mask_iou(stage_mask, golden_mask), boundary_f(stage_mask, golden_mask)
            j_gt, f_gt = mask_iou(stage_mask, truth), boundary_f(stage_mask, truth)
            rows.append({"video_id": clip.video_id, "object_id": o + 1, "frame": t, "j": j, "f": f, "jf": (j + f) / 2,
                         "jf_gt": (j_gt + f_gt) / 2, "golden_present": bool(golden_mask.any()),
                         "golden_jf_gt": (mask_iou(golden_mask, truth) + boundary_f(golden_mask, truth)) / 2})
    return rows


def compare(stage: str, outputs: list[ClipOutputs], golden: list[ClipOutputs], clips: list[Clip], limits: dict,
            masks_meaningful: bool) -> StageResult:
    by_id = {o.video_id: o for o in outputs}
    if sorted(by_id) != sorted(g.video_id for g in golden) or any(
            by_id[g.video_id].masks.shape != g.masks.shape for g in golden):
        return StageResult(stage, [], {}, error="the stage tracked other clips, objects or frames than the golden: "
                           "different data; regenerate the golden")
    clip_by_id = {c.video_id: c for c in clips}
    rows, drifts, score_err = [], [], 0.0
    ours_logits, golden_logits = [], []
    for gold in golden:
        ours = by_id[gold.video_id]
        clip_rows = per_object_frame(ours, gold, clip_by_id[gold.video_id])
        rows += clip_rows
        for o in range(gold.masks.shape[0]):
            drift = object_drift([r for r in clip_rows if r["object_id"] == o + 1])
            if drift is not None:
                drifts.append(drift)
        score_err = max(score_err, object_score_error(ours.object_scores, gold.object_scores))
        for t, golden_frame in gold.logits.items():
            # stored as fp16: round ours the same way, so storage is not counted as error
            ours_logits.append(ours.logits[t].astype(np.float16).astype(np.float32))
            golden_logits.append(golden_frame)
    logits = logits_error(np.stack(ours_logits), np.stack(golden_logits))
    jf = np.array([r["jf"] for r in rows])
    present = [r for r in rows if r["golden_present"]]
    lost = int(sum(r["j"] < LOST_J for r in present))
    per_object, per_frame = {}, {}
    for r in rows:
        per_object.setdefault(f"{r['video_id']}/{r['object_id']}", []).append(r["jf"])
        per_frame.setdefault(r["frame"], []).append(r["j"])
    summary = {
        "object_frames": len(rows),
        "jf_mean": float(jf.mean()), "jf_worst": float(jf.min()),
        "j_mean": float(np.mean([r["j"] for r in rows])), "f_mean": float(np.mean([r["f"] for r in rows])),
        "jf_per_object": {key: float(np.mean(v)) for key, v in per_object.items()},
        "drift_j_worst": min((d for d, _ in drifts), default=0.0),
        "j_by_frame": [float(np.mean(per_frame[t])) for t in sorted(per_frame)],
        "objects_lost": lost, "golden_present": len(present),
        "jf_gt_mean": float(np.mean([r["jf_gt"] for r in rows])),
        "jf_gt_mean_golden": float(np.mean([r["golden_jf_gt"] for r in rows])),
        "logits_rel_l2": logits["rel_l2"], "logits_max_abs": logits["max_abs"],
        "object_score_max_rel_err": score_err,
        "seconds": sum(o.seconds for o in outputs),
    }
    gated_drifts = [d for d, present in drifts if drift_gated(present)]
    gates = [
        Gate("logits_rel_l2", logits["rel_l2"], limits["max_logits_rel_l2"], "max", True),
        Gate("object_score_max_rel_err", score_err, limits["max_object_score_rel_err"], "max", True),
        Gate("jf_mean", summary["jf_mean"], limits["min_jf_mean"], "min", masks_meaningful),
        Gate("jf_worst", summary["jf_worst"], limits["min_jf_worst"], "min", masks_meaningful),
        Gate("objects_lost", lost, limits["max_objects_lost"], "max", masks_meaningful),
        # the worst object's fall of mean J from its first frames to its last (a rise is no drift to fail),
        # gated over the objects with windows of DRIFT_FRAMES; reported over all where none has them
        Gate("drift_j_fall", max(0.0, -min(gated_drifts or [summary["drift_j_worst"]])), limits["max_drift_j_fall"],
             "max", masks_meaningful and bool(gated_drifts)),
    ]
    worst = sorted(rows, key=lambda r: (r["jf"], r["j"]))[:WORST_SHOWN]
    golden_by_id = {g.video_id: g for g in golden}
    worst_masks = {}
    if worst:
        w = worst[0]
        o, t = w["object_id"] - 1, w["frame"]
        worst_masks[0] = (golden_by_id[w["video_id"]].masks[o, t], by_id[w["video_id"]].masks[o, t])
    return StageResult(stage, gates, summary, worst, worst_masks=worst_masks)
