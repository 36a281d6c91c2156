"""Longest first: the gate's pytest runs start the tests that took longest in its previous run.

A step ends when its last test does, so a slow test that starts late sets the step's wall time
(on the H100 the CPU layers' 10 workers had ~206 s of work each and ended at 256 s). Starting
the slowest first is the classic fix (longest processing time first).

The gate keeps each run's per-test seconds in the compile-cache folder, which a runner keeps
between runs and which is validated like the rest of it, and names the file in SAMFAST_TEST_TIMES
for its pytest runs; tests/conftest.py reorders the collected tests with `longest_first`. xdist
workers each collect and must agree on the order: they read the same file, which nothing writes
while the run lasts, and the sort is stable. Without the variable (plain pytest, CI) the
collection order stands.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable, Hashable, Sequence, TypeVar

from parity.gate import timing as gate_time

TIMES_ENV = "SAMFAST_TEST_TIMES"
TIMES_FILE = "test-times.json"

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


def longest_first(items: Sequence[Item], seconds: dict[str, float], nodeid: Callable[[Item], str],
                  group_of: Callable[[Item], Hashable]) -> list[Item]:
    """`items` with the groups (tests that share an xdist group stay together; any other test is a
    group of one) ordered by their tests' seconds last time, longest first. A test never timed
    counts as the longest (it may be slow); equal groups keep the collection order."""
    groups = [group_of(item) for item in items]
    totals: dict[Hashable, float] = {}
    first_seen: dict[Hashable, int] = {}
    for index, (item, group) in enumerate(zip(items, groups)):
        totals[group] = totals.get(group, 0.0) + seconds.get(nodeid(item), math.inf)
        first_seen.setdefault(group, index)
    order = sorted(range(len(items)), key=lambda i: (-totals[groups[i]], first_seen[groups[i]]))
    return [items[i] for i in order]


def xdist_group(item) -> Hashable:
    """A pytest item's xdist group (the name its xdist_group mark gives), else its own node id."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return item.nodeid
    return "group:" + str(mark.args[0] if mark.args else mark.kwargs.get("name"))
