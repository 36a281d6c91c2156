"""parity.gate.scheduler: the gate's xdist groups start longest first and no worker hoards the next group.

`replay` drives a real xdist scheduler (xdist's LoadGroupScheduling or the gate's) with stand-in
workers on a simulated clock, following a worker's own rule (it runs a test once it knows the next
one, or once it is told to shut down), so the schedules below are the ones a real session makes
with those test times.
"""

from __future__ import annotations

import heapq
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("xdist", reason="without pytest-xdist the gate runs one process: nothing to schedule")
from xdist.scheduler import LoadGroupScheduling  # noqa: E402

from parity.gate import run_order  # noqa: E402
from parity.gate import timing as gate_time  # noqa: E402
from parity.gate.scheduler import LongestFirstScheduling  # noqa: E402
from tests import conftest  # noqa: E402
from tests.child_env import child_env  # noqa: E402


class Worker:
    """What a scheduler sees of an xdist worker: the tests it was sent, in order, and its shutdown."""

    def __init__(self, name: str):
        self.gateway = SimpleNamespace(id=name)
        self.queued: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices):
        self.queued.extend(indices)

    def shutdown(self):
        self.shutting_down = True

    def can_run(self) -> bool:
        return len(self.queued) >= 2 or (self.shutting_down and bool(self.queued))


def replay(scheduler_class, tests: dict[str, float], workers: int, reorder: bool) -> tuple[float, dict[str, list[str]]]:
    """(when the last test ends, the tests each worker ran in order) for `tests` (node id -> seconds,
    in collection order; `name@group` puts a test in a group), scheduled by `scheduler_class`."""
    config = SimpleNamespace(getvalue={"tx": [f"{workers}*popen"]}.__getitem__,
                             option=SimpleNamespace(loadscopereorder=reorder))
    scheduler = scheduler_class(config)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    collection = list(tests)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    ran = {node.gateway.id: [] for node in nodes}
    running: list[tuple[float, int, int]] = []  # (ends at, worker, test index)
    busy = set()

    def start_what_can(now: float) -> None:
        for i, node in enumerate(nodes):
            if i not in busy and node.can_run():
                index = node.queued[0]
                heapq.heappush(running, (now + tests[collection[index]], i, index))
                busy.add(i)

    start_what_can(0.0)
    end = 0.0
    while running:
        end, i, index = heapq.heappop(running)
        nodes[i].queued.pop(0)
        busy.discard(i)
        ran[nodes[i].gateway.id].append(collection[index])
        scheduler.mark_test_complete(nodes[i], index, tests[collection[index]])
        start_what_can(end)
    assert all(not node.queued for node in nodes), "a worker was left waiting with tests queued"
    assert sum(map(len, ran.values())) == len(tests)
    return end, ran


def longest_first(tests: dict[str, float]) -> dict[str, float]:
    """`tests` in the order tests/conftest.py gives the gate's runs (run_order.longest_first)."""
    order = run_order.longest_first(list(tests), tests, nodeid=lambda t: t,
                                    group_of=lambda t: t.split("@")[-1] if "@" in t else t)
    return {t: tests[t] for t in order}


# Collection order: a group of many quick doc tests first, then the slow single tests.
DOCS_FIRST = {**{f"test_docs.py::test_command[{i}]@docs": 0.5 for i in range(8)},
              "test_a.py::test_compile": 20.0, "test_b.py::test_train": 16.0, "test_c.py::test_golden": 12.0}


def test_xdist_sorting_by_test_count_starts_the_slow_tests_late_and_the_gate_keeps_its_order():
    tests = longest_first(DOCS_FIRST)
    assert list(tests)[0] == "test_a.py::test_compile"
    shipped, _ = replay(LoadGroupScheduling, tests, workers=2, reorder=True)
    gate, ran = replay(LongestFirstScheduling, tests, workers=2, reorder=False)
    assert ran["gw0"][0] == "test_a.py::test_compile" and ran["gw1"][0] == "test_b.py::test_train"
    # each worker starts with two tests (it runs one once it knows the next): compile then golden (32 s)
    # beside train then the docs; xdist's own order starts the docs, and train waits behind compile: 36 s
    assert ran["gw0"] == ["test_a.py::test_compile", "test_c.py::test_golden"] and (gate, shipped) == (32.0, 36.0)


def test_a_worker_is_not_sent_the_next_group_while_two_of_its_tests_are_left():
    """A group of two 8 s tests and single tests of 5 and 2 s on 2 workers: xdist's loadgroup sends the
    2 s test to the group's worker at once (it tops up at 2 pending tests) and ends at 18 s; the gate's
    waits until a worker is down to its last test, and the 2 s test runs after the 5 s one: 16 s."""
    tests = {"t.py::test_g[0]@g": 8.0, "t.py::test_g[1]@g": 8.0, "t.py::test_five": 5.0, "t.py::test_two": 2.0}
    hoarding, ran_hoarding = replay(LoadGroupScheduling, tests, workers=2, reorder=False)
    gate, ran = replay(LongestFirstScheduling, tests, workers=2, reorder=False)
    assert ran_hoarding["gw0"] == [*list(tests)[:2], "t.py::test_two"] and hoarding == 18.0
    assert ran["gw1"] == ["t.py::test_five", "t.py::test_two"] and gate == 16.0


def test_groups_stay_on_one_worker():
    tests = longest_first({**{f"m.py::test_m[{i}]@m": 1.0 for i in range(5)},
                           **{f"s{i}.py::test": float(i) for i in range(1, 7)}})
    _, ran = replay(LongestFirstScheduling, tests, workers=3, reorder=False)
    holders = [worker for worker, done in ran.items() if any("@m" in t for t in done)]
    assert len(holders) == 1 and sum("@m" in t for t in ran[holders[0]]) == 5


PROBES = "tests/unit/xdist_probe.py"  # not test_*.py: collected only when named, as the session below does
PROBE = PROBES + "::test_probe"


def test_the_gates_runs_start_the_longest_first_in_a_real_xdist_session(tmp_path):
    """Under the gate (SAMFAST_TEST_TIMES set) this project's conftest makes LongestFirstScheduling the
    scheduler of `--dist loadgroup`, and the gate passes --no-loadscope-reorder: in a real session of
    two workers a group of four quick tests (collected first) and two single tests that were slow last
    time, each worker starts with a slow one; in xdist's own order one worker starts with the group."""
    times = tmp_path / "test-times.json"
    gate_time.write_tests(times, [gate_time.TestTime(nodeid, "unit", seconds, 0.0, "passed") for nodeid, seconds in
                                  [*((f"{PROBE}_group[{i}]@probe", 0.1) for i in range(4)),
                                   (f"{PROBE}_single_a", 10.0), (f"{PROBE}_single_b", 10.0)]])
    root = Path(__file__).resolve().parents[2]

    def first_on_each_worker(*options: str) -> set[str]:
        log = tmp_path / f"started{len(options)}.txt"
        env = child_env(SAMFAST_PROBE_LOG=str(log), **{run_order.TIMES_ENV: str(times)})
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                               "loadgroup", *options, PROBES],
                              cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "6 passed" in done.stdout, done.stdout + done.stderr
        first = {}
        for line in log.read_text().splitlines():
            worker, name = line.split()
            first.setdefault(worker, name)
        return set(first.values())

    assert first_on_each_worker("--no-loadscope-reorder") == {"single_a", "single_b"}
    assert "group0" in first_on_each_worker()


def test_the_conftest_picks_it_only_for_the_gates_loadgroup_runs(monkeypatch):
    config = SimpleNamespace(getvalue={"dist": "loadgroup", "tx": ["2*popen"]}.__getitem__,
                             option=SimpleNamespace(loadscopereorder=False))
    monkeypatch.setenv(run_order.TIMES_ENV, "/nowhere/test-times.json")
    assert isinstance(conftest.pytest_xdist_make_scheduler(config, None), LongestFirstScheduling)
    monkeypatch.delenv(run_order.TIMES_ENV)
    assert conftest.pytest_xdist_make_scheduler(config, None) is None  # plain pytest, CI: xdist's own

