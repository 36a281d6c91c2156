"""SAMFAST_GPU_WAIT on a real driver: the schedule reaches the context PyTorch uses, and a late call is refused.

Each case runs in a fresh interpreter: this worker's own context already exists (and the gate sets its wait).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from parity.gate import gpu_wait

pytestmark = pytest.mark.gpu

SET_THEN_USE = """
from parity.gate import gpu_wait
import torch
gpu_wait.apply()
torch.ones(1, device="cuda").add_(1).item()  # PyTorch creates and uses the primary context
print(gpu_wait.current_schedule())
"""

USE_THEN_SET = """
import torch
from parity.gate import gpu_wait
torch.ones(1, device="cuda").item()
gpu_wait.apply()
"""


def _python(code: str, wait: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, gpu_wait.WAIT_ENV: wait},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("wait", ["block", "yield", "spin"])
def test_the_schedule_reaches_pytorchs_context(wait):
    run = _python(SET_THEN_USE, wait)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] == wait


def test_after_cuda_started_it_is_refused():
    run = _python(USE_THEN_SET, "block")
    assert run.returncode != 0
    assert "already runs" in run.stderr
