"""glibc's malloc for processes that allocate and free big CPU tensors over and over.

glibc serves every allocation above its mmap threshold (at most 32 MB) with a fresh mmap and unmaps it at
free, so each use of a big activation faults its pages in again, one by one, and the kernel zeroes each.
The CPU layers and checks do little else: on the 2-core machine the AMG check's fp32 stage took 46 s of
user and 39 s of system time (20 M page faults), and tests/parity/test_sam2_gate.py with
tests/unit/test_sam2_amg.py 152 s user and 92 s system. Served from the heap, with up to 1 GiB free at its
top kept for the next allocation, the same runs took 2-8 s and 3 s of system time; their peak memory grew,
2.2 to 3.8 GB and 3.4 to 4.7 GB, as freed chunks between live ones are kept for reuse (docs/gate-time.md,
"The allocator"). Other C libraries ignore these variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# M_MMAP_MAX 0: no allocation is an mmap of its own; M_TRIM_THRESHOLD: the heap returns its free top to
# the system only beyond 1 GiB, so a freed activation's pages serve the next one
HEAP_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def heap_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`environ` with HEAP_ENV's settings for the processes started with it, unless it sets them itself."""
    return {**HEAP_ENV, **environ}
