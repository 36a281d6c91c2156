"""Probe tests for tests/unit/test_gate_scheduler.py, which runs this file in an xdist session of its own
(named on its command line: the file is not test_*.py, so the suite does not collect it). Each test
notes, in the file SAMFAST_PROBE_LOG names, that it started and on which worker."""

from __future__ import annotations

import os

import pytest


def _started(name: str) -> None:
    with open(os.environ["SAMFAST_PROBE_LOG"], "a") as log:  # one short append: two workers' lines do not mix
        log.write(f"{os.environ['PYTEST_XDIST_WORKER']} {name}\n")


@pytest.mark.xdist_group("probe")
@pytest.mark.parametrize("i", range(4))
def test_probe_group(i):
    _started(f"group{i}")


def test_probe_single_a():
    _started("single_a")


def test_probe_single_b():
    _started("single_b")
