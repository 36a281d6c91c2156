"""parity.gate.threads: processes side by side share the cores as OpenMP threads instead of each taking all."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from parity.gate import threads
from tests.child_env import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_workers_split_the_cores_and_the_processes_they_start_inherit_the_split():
    taken, env = [], {}
    assert threads.share_cores(2, taken.append, env, cores=2) == 1
    assert taken == [1] and env == {threads.ENV: "1"}
    assert threads.share_cores(4, taken.append, {}, cores=16) == 4
    assert threads.share_cores(3, taken.append, {}, cores=2) == 1  # never 0 threads


def test_a_thread_count_the_caller_set_is_kept():
    """The gate's CPU layers set OMP_NUM_THREADS for their workers (cpu_layers_env): a worker keeps it."""
    taken, env = [], {threads.ENV: "3"}
    assert threads.share_cores(2, taken.append, env, cores=2) is None
    assert taken == [] and env == {threads.ENV: "3"}


def test_an_xdist_worker_of_this_suite_takes_its_share(tmp_path):
    """The conftest's hook in a real xdist run of two workers: each runs its half of the cores as threads
    (one on the 2-core machine), where torch alone would give it one per core."""
    pytest.importorskip("xdist", reason="pytest-xdist is not installed")
    probe = tmp_path / "test_probe.py"
    probe.write_text("import os, torch\nfrom parity.gate import threads\n\ndef test_threads():\n"
                     "    share = threads.per_process(threads.available_cores(), 2)\n"
                     "    assert (torch.get_num_threads(), os.environ[threads.ENV]) == (share, str(share))\n")
    env = child_env(SAMFAST_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(threads.ENV, None)
    # the suite's conftest as a plugin: the probe lies outside tests/, where pytest would not load it
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "-n", "2", str(probe)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
