"""Speed and memory budgets per (GPU, model, stage, batch), from parity/budgets.toml.

    budget = lookup(torch.cuda.get_device_name(), "vit_b", "int8", 32)
    failures = check(budget, img_s=91.2, peak_gib=2.7)   # [] when within budget
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from samfast.stages import SWITCHES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "budgets.toml"
GPU_KEYS = ("A100", "H100", "H200")
MODELS = ("vit_tiny", "vit_b", "vit_l", "vit_h")
_FIELDS = {"min_img_s", "max_peak_gib", "source", "provisional", "compile_mode"}
COMPILE_MODES = ("max-autotune", "default")


class BudgetError(ValueError):
    """budgets.toml is malformed: the message names the row and the fix."""


class MissingBudget(LookupError):
    """No budget row for this (GPU, model, stage, batch): the message names the row to add."""


@dataclass(frozen=True)
class Budget:
    gpu: str
    model: str
    stage: str
    batch: int
    min_img_s: float
    max_peak_gib: float
    source: str
    provisional: bool = False
    compile_mode: str = "max-autotune"  # the mode the perf layer compiles the row's stage in

    @property
    def row(self) -> str:
        return _row(self.gpu, self.model, self.stage, self.batch)


def _row(gpu: str, model: str, stage: str, batch: int | str) -> str:
    return f"[{gpu}.{model}.{stage}.{batch}]"


def gpu_key(name: str) -> str | None:
    """Our key for a torch.cuda.get_device_name() string, e.g. "NVIDIA H100 80GB HBM3" -> "H100".

    None for a GPU we keep no budgets for. Whole words only, so "GH200" is not an "H200".
    """
    m = re.search(r"(?<![A-Za-z0-9])(" + "|".join(GPU_KEYS) + r")(?![0-9])", name.upper())
    return m.group(1) if m else None


def load_budgets(path: str | Path | None = None) -> dict[tuple[str, str, str, int], Budget]:
    """Every row of the budgets file, validated, keyed by (gpu, model, stage, batch)."""
    path = Path(path) if path else DEFAULT_PATH
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as err:
            raise BudgetError(f"{path}: not valid TOML: {err}") from err

    def fail(where: str, what: str) -> BudgetError:
        return BudgetError(f"{path}: {where}: {what}")

    budgets = {}
    for gpu, models in data.items():
        # read by parity.compare.gates (accuracy, amg, video, concept), parity.gate.time_budget
        if gpu in ("accuracy", "amg", "video", "concept", "gate_time"):
            continue
        if gpu not in GPU_KEYS:
            raise fail(f"[{gpu}]", f"unknown GPU key; use one of {', '.join(GPU_KEYS)}")
        for model, stages in models.items():
            if model not in MODELS:
                raise fail(f"[{gpu}.{model}]", f"unknown model; use one of {', '.join(MODELS)}")
            for stage, batches in stages.items():
                unknown = [s for s in stage.split("+") if s not in SWITCHES]
                if unknown:
                    raise fail(_row(gpu, model, stage, "*"), f"unknown stage {unknown}; use {', '.join(SWITCHES)} or a+b")
                for batch, fields in batches.items():
                    where = _row(gpu, model, stage, batch)
                    if not batch.isdigit() or int(batch) < 1 or not isinstance(fields, dict):
                        raise fail(where, "expected a positive batch size holding a table of fields")
                    budgets[(gpu, model, stage, int(batch))] = _budget(gpu, model, stage, int(batch), fields, lambda w: fail(where, w))
    return budgets


def _budget(gpu, model, stage, batch, fields: dict, fail) -> Budget:
    if extra := set(fields) - _FIELDS:
        raise fail(f"unknown field(s) {sorted(extra)}; allowed: {sorted(_FIELDS)}")
    for name in ("min_img_s", "max_peak_gib"):
        value = fields.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise fail(f"{name} must be a positive number, got {value!r}")
    source = fields.get("source")
    if not isinstance(source, str) or not source.strip():
        raise fail("missing source: say where the numbers came from (a published table, a measured run)")
    provisional = fields.get("provisional", False)
    if not isinstance(provisional, bool):
        raise fail(f"provisional must be true or false, got {provisional!r}")
    compile_mode = fields.get("compile_mode", COMPILE_MODES[0])
    if compile_mode not in COMPILE_MODES:
        raise fail(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {compile_mode!r}")
    return Budget(gpu, model, stage, batch, float(fields["min_img_s"]), float(fields["max_peak_gib"]), source,
                  provisional, compile_mode)


def lookup(
    gpu: str,
    model: str,
    stage: str,
    batch: int,
    budgets: dict[tuple[str, str, str, int], Budget] | None = None,
) -> Budget:
    """The budget row for a GPU (a key like "H100" or a device name), or MissingBudget."""
    budgets = load_budgets() if budgets is None else budgets
    key = gpu if gpu in GPU_KEYS else gpu_key(gpu)
    row = _row(key or gpu, model, stage, batch)
    if key is None:
        raise MissingBudget(
            f"no budget row {row}: GPU {gpu!r} has no budgets (known: {', '.join(GPU_KEYS)}). "
            "Add rows for it to parity/budgets.toml from a measured run, or pass "
            "--budget-gpu NAME to hold it to another GPU's budgets."
        )
    try:
        return budgets[(key, model, stage, int(batch))]
    except KeyError:
        raise MissingBudget(
            f"no budget row {row} in parity/budgets.toml. Add it under [{key}.{model}] as "
            f'{stage}.{batch} = {{ min_img_s = ..., max_peak_gib = ..., source = "..." }} from a '
            "measured run, or pass --budget-gpu NAME to use another GPU's row."
        ) from None


def check(budget: Budget, img_s: float, peak_gib: float) -> list[str]:
    """Each way a measurement misses its budget, with measured vs budget; [] when it passes."""
    failures = []
    row = budget.row + (" (provisional)" if budget.provisional else "")
    # `not >=` so that a NaN measurement fails too.
    if not img_s >= budget.min_img_s:
        failures.append(
            f"{row} img/s {img_s:.2f} < floor {budget.min_img_s:.2f} "
            f"({img_s / budget.min_img_s:.1%} of budget)"
        )
    if not peak_gib <= budget.max_peak_gib:
        failures.append(
            f"{row} peak memory {peak_gib:.3f} GiB > ceiling {budget.max_peak_gib:.3f} GiB "
            f"({peak_gib / budget.max_peak_gib:.1%} of budget)"
        )
    return failures
