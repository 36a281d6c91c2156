"""parity.gate.allocator: processes started with heap_env reuse a freed activation's pages for the next
one, where glibc's default maps and unmaps each (the page faults are what the setting removes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from parity.gate.allocator import HEAP_ENV, heap_env

# An MLP over 16,384 tokens four times, as the models' blocks run: its 128 MB hidden activation made and
# freed at each step, with the smaller tensors around it; prints the minor page faults of the four steps.
FAULTS = """
import resource
import torch
torch.manual_seed(0)
x = torch.randn(16384, 256)
w = torch.randn(2048, 256) / 16
def step():
    return torch.nn.functional.gelu(x @ w.T) @ w
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
HIDDEN_PAGES = (16384 * 2048 * 4) // os.sysconf("SC_PAGE_SIZE")


def faults(env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", FAULTS], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings: Linux only")
def test_the_heap_serves_the_next_activation_from_the_last_ones_pages():
    plain = {k: v for k, v in os.environ.items() if k not in HEAP_ENV}
    default = faults(plain)
    # glibc's default: every step's activations are fresh mappings, each page faulted in again
    assert default >= 4 * HIDDEN_PAGES
    # from the heap: measured 3 to 4 times fewer on the 2-core machine (one or two threads)
    assert faults(heap_env(plain)) < default // 2


def test_settings_a_caller_made_are_kept():
    assert heap_env({"MALLOC_MMAP_MAX_": "65536", "PATH": "/bin"}) == {
        "MALLOC_MMAP_MAX_": "65536", "MALLOC_TRIM_THRESHOLD_": HEAP_ENV["MALLOC_TRIM_THRESHOLD_"], "PATH": "/bin"}
