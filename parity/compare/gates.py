"""Compare a stage's outputs with the golden and apply the stage's accuracy thresholds.

Thresholds live in parity/budgets.toml under [accuracy.<stage>]. A switch combination takes the
thresholds of its lossiest switch (the one furthest along the ladder). With seeded synthetic
weights masks mean nothing (logits ~0.07, half-image masks): there the logits error gates and
mask IoU is only reported; with real or trained weights mask IoU gates too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from parity.evaluate import StageOutputs, decode_rle
from parity.metrics import logits_error, mask_iou, miou_vs_ground_truth, summarize_ious
from samfast.stages import parse_stages

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from parity.checks.budgets import DEFAULT_PATH as BUDGETS_PATH
from parity.checks.budgets import BudgetError

WORST_SHOWN = 5
NEAR_FAILING = 0.9  # a passing gate that uses 90% or more of its limit (Gate.ratio) is shown like a failure


@dataclass
class Gate:
    metric: str
    value: float
    limit: float
    kind: str  # "min" or "max"
    gated: bool  # False: reported only (e.g. mask IoU on seeded weights)

    @property
    def passed(self) -> bool:
        # written so that NaN fails: NaN compares False both ways
        return bool(self.value >= self.limit) if self.kind == "min" else bool(self.value <= self.limit)

    @property
    def ratio(self) -> float:
        """The share of the allowed error this value uses: above 1 fails, NEAR_FAILING and up is near-failing.

        For an error bound (max) that is value / limit; for an IoU floor (min) the IoU lost over the
        IoU loss allowed, (1 - value) / (1 - limit): IoU 0.995 against a floor of 0.99 uses half of it.
        """
        spent, allowed = (self.value, self.limit) if self.kind == "max" else (1.0 - self.value, 1.0 - self.limit)
        if allowed == 0:
            return 0.0 if spent <= 0 else math.inf
        return spent / allowed

    @property
    def near_failing(self) -> bool:
        return self.gated and self.passed and self.ratio >= NEAR_FAILING

    def describe(self) -> str:
        sign = ">=" if self.kind == "min" else "<="
        verdict = "ok" if self.passed else ("FAIL" if self.gated else "below (not gated)")
        return f"{self.metric} {self.value:.6g} (needs {sign} {self.limit:g}): {verdict}"


@dataclass
class StageResult:
    stage: str
    gates: list[Gate]
    summary: dict
    worst: list[dict] = field(default_factory=list)
    error: str | None = None  # the stage could not run at all
    not_exercised: list[str] = field(default_factory=list)  # switches that did not run, with the reason
    exercise_required: bool = False  # --require-gpu: a switch that did not run fails the stage
    # ann_id -> (golden RLE, stage RLE) of the worst annotations only, for pictures; not in report.json
    worst_masks: dict[int, tuple[dict, dict]] = field(default_factory=dict, repr=False)
    pictures: dict[int, bytes] = field(default_factory=dict, repr=False)  # ann_id -> PNG, failed/near-failing stages

    @property
    def verdict(self) -> str:
        """"error", "fail", "not exercised" (a switch did not run; gates passed) or "pass"."""
        if self.error:
            return "error"
        if self.failures or (self.not_exercised and self.exercise_required):
            return "fail"
        return "not exercised" if self.not_exercised else "pass"

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def blocks(self) -> bool:
        """Whether this stage makes the gate fail (exit 1)."""
        return self.verdict in ("error", "fail")

    @property
    def failures(self) -> list[Gate]:
        return [g for g in self.gates if g.gated and not g.passed]

    @property
    def near_failing(self) -> list[Gate]:
        return [g for g in self.gates if g.near_failing]


# The switches that change arithmetic precision, mildest first. compile, sdpa, triton and nt only
# reorder the same arithmetic, so a stage is held to the precision it runs in: "fp32+sdpa" to fp32's
# thresholds, "nt" (bf16 + ...) to bf16's, "bf16+sdpa+int8" to int8's.
PRECISIONS = ("fp32", "bf16", "fp8", "int8", "sparse")


def load_thresholds(path=None, table: str = "accuracy") -> dict[str, dict]:
    """The [<table>.<precision>] thresholds: "accuracy" for point prompts, "amg" for segment-everything."""
    with open(path or BUDGETS_PATH, "rb") as f:
        try:
            thresholds = tomllib.load(f).get(table)
        except tomllib.TOMLDecodeError as err:
            raise BudgetError(f"{path or BUDGETS_PATH}: not valid TOML: {err}") from err
    if not thresholds:
        raise BudgetError(f"{path or BUDGETS_PATH} has no [{table}.<precision>] thresholds")
    missing = [s for s in PRECISIONS if s not in thresholds]
    if missing:
        raise BudgetError(f"{path or BUDGETS_PATH}: no [{table}] thresholds for {missing}; one table per {PRECISIONS}")
    return thresholds


def thresholds_for(stages: str, thresholds: dict[str, dict]) -> dict:
    """The thresholds of the lowest precision among the switches of `stages` (fp32's when none lowers it)."""
    lowered = parse_stages(stages) & set(PRECISIONS)
    return thresholds[max(lowered, key=PRECISIONS.index) if lowered else "fp32"]


def compare(stage: str, outputs: StageOutputs, golden: StageOutputs, limits: dict, masks_meaningful: bool) -> StageResult:
    """Per-annotation comparison with the golden; gates per `limits`."""
    golden_by_id = {a.ann_id: a for a in golden.annotations}
    ours_by_id = {a.ann_id: a for a in outputs.annotations}
    if set(golden_by_id) != set(ours_by_id):
        return StageResult(stage, [], {}, error=(
            f"the stage produced annotations {len(ours_by_id)} vs golden {len(golden_by_id)}: "
            "different data or prompts; regenerate the golden"))
    per_ann = []
    for ann_id, gold in golden_by_id.items():
        ours = ours_by_id[ann_id]
        # SAM keeps the mask of highest predicted IoU. When the golden's own scores for the two
        # masks differ by less than the stage may move a score, either choice is correct and
        # rounding picks one: then the stage's mask is compared with the golden's mask of the
        # same index (the golden keeps all three), and the flip is counted, not failed.
        near_tie = ours.best != gold.best and (
            abs(gold.scores[ours.best] - gold.scores[gold.best]) <= limits["max_score_abs_err"])
        reference = ours.best if near_tie else gold.best
        iou = mask_iou(decode_rle(ours.rles[ours.best]), decode_rle(gold.rles[reference]))
        score_err = float(np.max(np.abs(np.subtract(ours.scores, gold.scores))))
        per_ann.append({"ann_id": ann_id, "image_id": gold.image_id, "iou_vs_golden": iou,
                        "best": ours.best, "golden_best": gold.best, "near_tie": near_tie,
                        "score_abs_err": score_err})
    ious = summarize_ious([p["iou_vs_golden"] for p in per_ann])
    common = sorted(set(golden.logits) & set(outputs.logits))
    # The golden stores logits in fp16: round ours the same way, so storage is not counted as error.
    ours_logits = [outputs.logits[i].astype(np.float16).astype(np.float32) for i in common]
    logits = logits_error(np.stack(ours_logits), np.stack([golden.logits[i] for i in common])) if common else None
    gt_ours = miou_vs_ground_truth((a.category_id, a.gt_iou) for a in outputs.annotations)
    gt_gold = miou_vs_ground_truth((a.category_id, a.gt_iou) for a in golden.annotations)
    max_score_err = max(p["score_abs_err"] for p in per_ann)

    gates = []
    if logits is not None:
        gates.append(Gate("logits_rel_l2", logits["rel_l2"], limits["max_logits_rel_l2"], "max", True))
    gates.append(Gate("score_max_abs_err", max_score_err, limits["max_score_abs_err"], "max", True))
    gates += [
        Gate("mask_iou_mean", ious.mean, limits["min_mean_iou"], "min", masks_meaningful),
        Gate("mask_iou_p5", ious.p5, limits["min_p5_iou"], "min", masks_meaningful),
        Gate("miou_gt_drop", gt_gold["mean"] - gt_ours["mean"], limits["max_miou_drop"], "max", masks_meaningful),
    ]
    summary = {
        "annotations": ious.count,
        "mask_iou_mean": ious.mean,
        "mask_iou_p5": ious.p5,
        "mask_iou_min": ious.min,
        "masks_below_half": ious.n_below_half,
        "best_mask_changed": sum(p["best"] != p["golden_best"] for p in per_ann),
        "best_mask_near_ties": sum(p["near_tie"] for p in per_ann),
        "logits_rel_l2": None if logits is None else logits["rel_l2"],
        "logits_cosine": None if logits is None else logits["cosine"],
        "logits_max_abs": None if logits is None else logits["max_abs"],
        "score_max_abs_err": max_score_err,
        "miou_gt": gt_ours["mean"],
        "miou_gt_golden": gt_gold["mean"],
        "miou_gt_per_category": gt_ours["per_category"],
        "seconds": outputs.seconds,
        "first_batch_seconds": outputs.first_batch_seconds,
        "steady_img_s": outputs.steady_img_s,
    }
    worst = sorted(per_ann, key=lambda p: (p["iou_vs_golden"], -p["score_abs_err"]))[:WORST_SHOWN]
    worst_masks = {}
    for w in worst:
        ours, gold = ours_by_id[w["ann_id"]], golden_by_id[w["ann_id"]]
        worst_masks[w["ann_id"]] = (gold.rles[ours.best if w["near_tie"] else gold.best], ours.rles[ours.best])
    return StageResult(stage, gates, summary, worst, worst_masks=worst_masks)
