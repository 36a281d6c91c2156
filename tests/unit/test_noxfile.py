"""noxfile.py's tests session: what pytest command it runs for the arguments after `--` and the cores it has."""

from __future__ import annotations

import functools
import importlib.util
import os
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("nox", reason="nox is in the test extra: pip install -e .[test]")

import parity.gate.run as gate_run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@functools.cache  # nox registers each session as the file runs: once per process
def load_noxfile():
    spec = importlib.util.spec_from_file_location("noxfile_under_test", REPO / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordingSession:
    """What the tests session calls: every session.run is recorded, none runs (the install probe succeeds)."""

    def __init__(self, posargs: list[str]):
        self.posargs = posargs
        self.runs: list[tuple[str, ...]] = []

    def run(self, *args, **kwargs):
        self.runs.append(args)

    def log(self, message: str) -> None:
        pass


def pytest_command(posargs: list[str], cores: int, monkeypatch) -> list[str]:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    session = RecordingSession(posargs)
    load_noxfile().tests(session)
    pytests = [list(args) for args in session.runs if args[:3] == ("python", "-m", "pytest")]
    assert len(pytests) == 1, session.runs
    return pytests[0][3:]


def test_arguments_after_the_separator_replace_the_default_selection(monkeypatch):
    """`nox -s tests -- PATH` runs PATH only, not all of tests beside it."""
    command = pytest_command(["tests/unit/test_amg.py", "-k", "nms"], 2, monkeypatch)
    assert command == ["tests/unit/test_amg.py", "-k", "nms", "-n", "2", "--dist", "loadgroup"]


def test_without_arguments_it_runs_tests_over_a_worker_per_core(monkeypatch):
    assert pytest_command([], 2, monkeypatch) == ["tests", "-n", "2", "--dist", "loadgroup"]
    assert pytest_command([], 1, monkeypatch) == ["tests"]


def test_options_alone_still_select_tests_through_testpaths(monkeypatch):
    """Options with no path leave pytest to its testpaths, which must be the default selection."""
    assert pytest_command(["-x"], 2, monkeypatch)[0] == "-x"
    testpaths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    assert testpaths == ["tests"]


@pytest.mark.parametrize("chosen", [["-n", "0"], ["-n0"], ["--numprocesses=3"], ["-p", "no:xdist"]])
def test_a_worker_count_chosen_after_the_separator_is_left_alone(chosen, monkeypatch):
    assert pytest_command(chosen, 8, monkeypatch) == chosen


def test_the_worker_count_is_the_gates_choice(monkeypatch):
    """The session asks parity.gate.run.choose_cpu_workers (its cap, its xdist check), no copy of it:
    a changed cap there changes the session's count."""
    assert pytest_command([], 40, monkeypatch)[1:3] == ["-n", str(gate_run.MAX_CPU_WORKERS)]
    monkeypatch.setattr(gate_run, "MAX_CPU_WORKERS", 3)
    assert pytest_command([], 8, monkeypatch) == ["tests", "-n", "3", "--dist", "loadgroup"]
