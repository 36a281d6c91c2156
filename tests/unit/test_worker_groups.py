"""parity.gate.worker_groups: under xdist, a module fixture is built once, on the worker its tests share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Eight tests share a module fixture that logs each build; two tests do not (one with an xdist group of
# its own, which it must keep).
TESTS = """
import os, pytest

@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILD_LOG"], "a") as log:
        log.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return 1

@pytest.mark.parametrize("i", range(8))
def test_shared(built, i):
    assert built == 1

def test_alone(tmp_path):
    pass

@pytest.mark.xdist_group("its-own")
def test_own_group(tmp_path):
    pass
"""

CONFTEST = """
import os
from parity.gate import worker_groups

def pytest_configure(config):
    if os.environ.get("GROUP") == "1":
        config.pluginmanager.register(worker_groups.ModuleFixtureGroups())

def pytest_collection_modifyitems(items):
    with open(os.environ["GROUPS_LOG"], "a") as log:
        for item in items:
            mark = item.get_closest_marker("xdist_group")
            log.write(f"{item.name} {mark.args[0] if mark else '-'}\\n")
"""


def _run(tmp_path: Path, group: bool) -> tuple[list[str], dict[str, str]]:
    """(the workers that built the fixture, test name -> xdist group) of a run over 2 xdist workers."""
    folder = tmp_path / ("grouped" if group else "plain")
    folder.mkdir()
    (folder / "test_shared_fixture.py").write_text(TESTS)
    (folder / "conftest.py").write_text(CONFTEST)
    env = {**os.environ, "BUILD_LOG": str(folder / "builds"), "GROUPS_LOG": str(folder / "groups"),
           "GROUP": "1" if group else "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", str(folder)], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    groups = dict(line.split(" ", 1) for line in (folder / "groups").read_text().splitlines())
    return (folder / "builds").read_text().split(), groups


def test_tests_sharing_a_module_fixture_build_it_once_under_xdist(tmp_path):
    pytest.importorskip("xdist")
    builds, groups = _run(tmp_path, group=True)
    assert len(builds) == 1, builds
    assert {groups[f"test_shared[{i}]"] for i in range(8)} == {"module:test_shared_fixture.py"}
    assert groups["test_own_group"] == "its-own" and groups["test_alone"] == "-"


def test_without_the_groups_each_worker_builds_the_fixture(tmp_path):
    """The defect the groups mend: xdist hands the eight tests to both workers (two each to start),
    and each builds the module fixture."""
    pytest.importorskip("xdist")
    builds, groups = _run(tmp_path, group=False)
    assert sorted(builds) == ["gw0", "gw1"], builds
    assert groups["test_shared[0]"] == "-"
