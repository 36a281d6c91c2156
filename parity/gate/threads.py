"""OpenMP threads for processes that share one machine's cores.

torch gives every process an OpenMP thread per core. Several such processes side by side (pytest-xdist
workers, the gate's steps) hold more threads than there are cores, and OpenMP's waiting threads spin on
cores the others need: on the 2-core machine, two processes running tests/unit/test_sam2_video.py side by
side took 297 s each with two threads apiece and 46 s with one (docs/gate-time.md, "Threads").
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping

ENV = "OMP_NUM_THREADS"


def per_process(cores: int, processes: int) -> int:
    """Threads for each of `processes` that share `cores` evenly: at least one."""
    return max(1, cores // max(1, processes))


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def share_cores(processes: int, set_threads: Callable[[int], None], environ: MutableMapping[str, str] = os.environ,
                cores: int | None = None) -> int | None:
    """In one of `processes` processes started together (an xdist worker): unless the caller set ENV, take
    this process's share of the cores, for its own OpenMP (`set_threads`, torch.set_num_threads) and, through
    ENV, for the processes it starts (inductor's compile workers, a CLI a test runs). Returns the threads
    taken, or None when ENV was set already (the gate sets it for its CPU layers)."""
    if ENV in environ:
        return None
    threads = per_process(available_cores() if cores is None else cores, processes)
    environ[ENV] = str(threads)
    set_threads(threads)
    return threads
