"""A stage's verdict, whatever the task: its gates (a metric against a limit), its result, and the
thresholds it is held to.

Thresholds live in parity/budgets.toml under [<table>.<precision>] ("accuracy" for point prompts,
"amg" for segment everything). A switch combination takes the thresholds of its lossiest switch (the
one furthest along the ladder). How a task fills a StageResult: parity/tasks/<task>/compare.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
        verdict = ("ok" if self.passed else "FAIL") if self.gated else (
            "within the limit (not gated)" if self.passed else "past the limit (not gated)")
        return f"{self.metric} {self.value:.6g} (needs {sign} {self.limit:g}): {verdict}"


@dataclass
class StageResult:
    stage: str
    gates: list[Gate]
    summary: dict
    worst: list[dict] = field(default_factory=list)
    error: str | None = None  # the stage could not run at all
    not_exercised: list[str] = field(default_factory=list)  # switches that did not run, with the reason
    exercised: list[str] = field(default_factory=list)  # switches that ran, each with what proves it
    not_applicable: dict[str, str] = field(default_factory=dict)  # switch -> why the task ignores it
    exercise_required: bool = False  # --require-gpu: a switch that did not run fails the stage
    # the worst items' (golden, stage) masks only, for pictures; not in report.json. The point task: ann_id ->
    # RLEs; the video task: 0 -> the worst object-frame's arrays
    worst_masks: dict[int, tuple] = field(default_factory=dict, repr=False)
    # PNGs of failed/near-failing stages, keyed like worst_masks (segment everything: by image id)
    pictures: dict[int, bytes] = field(default_factory=dict, repr=False)

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


