"""Longest first: the gate's pytest runs start the tests that took longest in its previous run.

A step ends when its last test does, so a slow test that starts late sets the step's wall time
(on the H100 the CPU layers' 10 workers had ~206 s of work each and ended at 256 s). Starting
the slowest first is the classic fix (longest processing time first).

The gate keeps each run's per-test seconds in the compile-cache folder, which a runner keeps
between runs and which is validated like the rest of it, and names the file in SAMFAST_TEST_TIMES
for its pytest runs; tests/conftest.py reorders the collected tests with `longest_first`. xdist
workers each collect and must agree on the order: they read the same file, which nothing writes
while the run lasts, and the sort is stable. Without the variable (plain pytest, CI) the
collection order stands. A run on an empty cache (cold) is named COLD_ORDER instead: a cold run's
times, committed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Callable, Hashable, Sequence, TypeVar

from parity.gate import timing as gate_time

TIMES_ENV = "SAMFAST_TEST_TIMES"
TIMES_FILE = "test-times.json"
# The order of a run whose cache holds no previous run's times (a cold cache): a cold GPU gate's
# seconds (docs/gate-time.md names the run) for the tests that took COLD_ORDER_MIN_SECONDS or more,
# any other test counting as quick. Without it a cold run went in collection order, and
# the video tests (the last file) put 150 s of compiling on one GPU worker at the end
# (docs/gpu-gate.md). Rewrite it from a cold run's reports with
# `python -m parity.gate.run_order REPORT_DIR`.
COLD_ORDER = Path(__file__).with_name("cold-order.json")
COLD_ORDER_MIN_SECONDS = 1.0

Item = TypeVar("Item")


def read_seconds(path: Path) -> dict[str, float]:
    """nodeid -> seconds in the previous run; {} when there was none or the file cannot be read
    (then only the order is lost, never a test)."""
    try:
        return {t.nodeid: float(t.seconds) for t in gate_time.read_tests(path)}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        print(f"{TIMES_ENV}={path}: unreadable ({err.__class__.__name__}); keeping the collection order", file=sys.stderr)
        return {}


def read_order(path: Path) -> tuple[dict[str, float], float]:
    """(nodeid -> seconds, the seconds a test missing from them counts as) from a previous run's
    times (a gate-time file: a missing test was never timed, math.inf) or from COLD_ORDER's format."""
    try:
        data = json.loads(Path(path).read_text())
        if "seconds" in data:
            return {nodeid: float(s) for nodeid, s in data["seconds"].items()}, float(data["others"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass  # read_seconds says what went wrong
    return read_seconds(path), math.inf


def write_cold_order(tests: list[gate_time.TestTime], path: Path) -> int:
    """COLD_ORDER from a cold run's tests; how many it lists."""
    slow = {t.nodeid: round(t.seconds, 1) for t in sorted(tests, key=lambda t: t.nodeid)
            if t.seconds >= COLD_ORDER_MIN_SECONDS}
    Path(path).write_text(json.dumps({"about": "a cold gate run's test seconds (parity.gate.run_order.COLD_ORDER)",
                                      "others": COLD_ORDER_MIN_SECONDS / 2, "seconds": slow}, indent=0) + "\n")
    return len(slow)


def longest_first(items: Sequence[Item], seconds: dict[str, float], nodeid: Callable[[Item], str],
                  group_of: Callable[[Item], Hashable], untimed: float = math.inf) -> list[Item]:
    """`items` with the groups (tests that share an xdist group stay together; any other test is a
    group of one) ordered by their tests' seconds last time, longest first. A test missing from
    `seconds` counts as `untimed` (default: never timed, so the longest: it may be slow); equal
    groups keep the collection order."""
    groups = [group_of(item) for item in items]
    totals: dict[Hashable, float] = {}
    first_seen: dict[Hashable, int] = {}
    for index, (item, group) in enumerate(zip(items, groups)):
        totals[group] = totals.get(group, 0.0) + seconds.get(nodeid(item), untimed)
        first_seen.setdefault(group, index)
    order = sorted(range(len(items)), key=lambda i: (-totals[groups[i]], first_seen[groups[i]]))
    return [items[i] for i in order]


def xdist_group(item) -> Hashable:
    """A pytest item's xdist group (the name its xdist_group mark gives), else its own node id."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return item.nodeid
    return "group:" + str(mark.args[0] if mark.args else mark.kwargs.get("name"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parity.gate.run_order",
                                     description="rewrite COLD_ORDER from a cold gate run's report folder")
    parser.add_argument("report_dir", type=Path, help="the --report-dir of a gate run on an empty compile cache")
    args = parser.parse_args(argv)
    runs = [args.report_dir / f"gate-time-{run}.json" for run in ("gpu", "cpu", "perf")]  # the gate's pytest runs
    tests = [t for path in runs if path.exists() for t in gate_time.read_tests(path)]
    if not tests:
        parser.error(f"no gate-time-gpu/cpu/perf.json in {args.report_dir}: run `python -m parity.gate` there first")
    listed = write_cold_order(tests, COLD_ORDER)
    print(f"{COLD_ORDER}: {listed} tests of {len(tests)} took {COLD_ORDER_MIN_SECONDS} s or more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
