"""The gate's own time budget: wall seconds per step and for the whole run, per runner class and cache state.

    budget = load(runner_class(gpus), "cold")          # {"whole": 480.0, "gpu": 300.0, ...} or None
    findings = over_budget({"gpu": 412.0, "whole": 530.0}, budget)   # every step over its budget
    failing = over_budget({"gpu": 412.0, "whole": 530.0}, budget, STRICT_SLACK)  # those --strict-time fails

budgets.toml holds [gate_time.<runner class>.<cold|warm>] tables (keys: whole and the gate's steps,
STEPS). A run whose compile cache was left by a killed run ("resumed") is held to warm plus half of
(cold - warm) per step: what it did not finish it compiles again, what it finished it reuses.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from parity.checks.budgets import DEFAULT_PATH, BudgetError, gpu_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TABLE = "gate_time"
STATES = ("cold", "warm", "resumed")
# The gate's steps, as budgets.toml names them: the three pytest runs, the checks, the whole run.
STEPS = ("gpu", "cpu", "perf", "check", "check-amg", "check-sam2", "check-sam2-amg", "check-video", "check-concept",
         "whole")
FIELDS = {"source", "provisional"}


def runner_class(gpus: list[str]) -> str:
    """The budget row a machine reads: the GPU's key (H100, H200, A100), or CPU without a GPU."""
    if not gpus:
        return "CPU"
    return gpu_key(gpus[0]) or gpus[0]


def _table(path: Path, runner: str, state: str) -> dict[str, float] | None:
    with open(path, "rb") as f:
        try:
            rows = tomllib.load(f).get(TABLE, {})
        except tomllib.TOMLDecodeError as err:
            raise BudgetError(f"{path}: not valid TOML: {err}") from err
    fields = rows.get(runner, {}).get(state)
    if fields is None:
        return None
    where = f"{path}: [{TABLE}.{runner}.{state}]"
    if not isinstance(fields.get("source"), str) or not fields["source"].strip():
        raise BudgetError(f"{where}: missing source: say where the seconds came from (a target, a measured run)")
    seconds = {k: v for k, v in fields.items() if k not in FIELDS}
    for step, value in seconds.items():
        if step not in STEPS:
            raise BudgetError(f"{where}: unknown step {step!r}; use {', '.join(STEPS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise BudgetError(f"{where}: {step} must be a positive number of seconds, got {value!r}")
    if "whole" not in seconds:
        raise BudgetError(f"{where}: needs `whole`, the budget of the run from start to verdict")
    return {step: float(value) for step, value in seconds.items()}


def load(runner: str, state: str, path: Path | None = None) -> dict[str, float] | None:
    """The seconds allowed per step in this state, or None when budgets.toml has no row for this runner."""
    if state not in STATES:
        raise ValueError(f"cache state {state!r}: one of {STATES}")
    path = Path(path or DEFAULT_PATH)
    if state != "resumed":
        return _table(path, runner, state)
    cold, warm = _table(path, runner, "cold"), _table(path, runner, "warm")
    if cold is None or warm is None:
        return None
    return {step: warm[step] + (cold[step] - warm[step]) / 2 for step in warm if step in cold}


# --strict-time fails a step only past this multiple of its budget; below it a step over budget is a
# finding in the report. Healthy H100 runners of 16 cores differ: the same warm gate took 1.26x as long on
# one host (8351550) as on another (c43208b), its CPU layers 1.39x (docs/history/gpu-gate-time.md). The
# growth that made the budget (the gpu layer from 201 to 377 s, 1.9x: docs/history/gpu-gate-time.md) is well past it.
STRICT_SLACK = 1.5


def over_budget(wall: dict[str, float], budget: dict[str, float], slack: float = 1.0) -> list[str]:
    """One finding per step that took longer than slack times its budget (each names the budget itself),
    the furthest over first: slack 1 gives the report's findings, STRICT_SLACK those --strict-time fails."""
    over = [(wall[step] / limit, step, limit) for step, limit in budget.items()
            if step in wall and wall[step] > limit * slack]
    return [f"{step} took {wall[step]:.1f} s, over its {limit:g} s budget ({ratio:.2f}x)"
            for ratio, step, limit in sorted(over, reverse=True)]


def missing_row(runner: str, state: str) -> str:
    return (f"no time budget for runner class {runner} ({state} cache): add [{TABLE}.{runner}.{state}] "
            f"to parity/budgets.toml with whole = <seconds> and a source")
