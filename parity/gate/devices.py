"""Which GPU each pytest-xdist worker gets: one worker per GPU, found without initialising CUDA here.

    gpus = visible_gpus()                      # e.g. ["0", "1"]: CUDA_VISIBLE_DEVICES, else nvidia-smi
    gpu_for_worker("gw1", gpus)                # "1": what worker gw1 sets CUDA_VISIBLE_DEVICES to
    gpu_for_worker("gw3", gpus, per_gpu=2)     # "1": two workers per GPU, gw0 gw2 on "0", gw1 gw3 on "1"

A process that has initialised CUDA ignores later changes of CUDA_VISIBLE_DEVICES, so the controller
counts GPUs through nvidia-smi (or torch in a subprocess) and each worker sets its variable in
pytest_configure, before anything touches CUDA. By default more workers than GPUs is refused: two
workers on one GPU would time perf rows beside another test. The gate's run of the untimed GPU
layers (perf runs on its own afterwards) allows several per GPU through WORKERS_PER_GPU_ENV: their
time is mostly compiling, which is CPU work.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

WORKERS_PER_GPU_ENV = "SAMFAST_WORKERS_PER_GPU"


class WorkerAssignmentError(RuntimeError):
    """More xdist workers than GPUs, or a worker id that is not xdist's gwN."""


def gpu_names() -> list[str]:
    """The names nvidia-smi lists, one per GPU of the machine ([] without nvidia-smi or GPUs). Never initialises CUDA."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name ("unknown CPU" where /proc/cpuinfo has none): the gate's time depends on it as
    much as on the GPU (two H100 runners of 16 cores ran the same CPU-bound tests 30% apart)."""
    try:
        line = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("model name")), "")
    except OSError:
        line = ""
    return line.partition(":")[2].strip() or "unknown CPU"


def _torch_device_count() -> int:
    """torch.cuda.device_count() of a child process (for machines without nvidia-smi on PATH)."""
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                             capture_output=True, text=True, timeout=300, check=True).stdout
        return int(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0


def visible_gpus(env=os.environ) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (indices or UUIDs)."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    count = len(gpu_names()) or _torch_device_count()
    return [str(i) for i in range(count)]


def gpu_for_worker(worker_id: str, visible: list[str], per_gpu: int = 1) -> str | None:
    """CUDA_VISIBLE_DEVICES for xdist worker `worker_id` (gwK -> visible GPU K mod N, K < N * per_gpu); None without GPUs."""
    if not visible:
        return None  # a CPU-only run: the workers share the CPU, nothing to assign
    match = re.fullmatch(r"gw(\d+)", worker_id)
    if not match:
        raise WorkerAssignmentError(f"unexpected xdist worker id {worker_id!r} (expected gw0, gw1, ...)")
    k = int(match.group(1))
    if k >= len(visible) * per_gpu:
        raise WorkerAssignmentError(
            f"xdist worker {worker_id} has no GPU of its own: {len(visible)} visible ({','.join(visible)}), "
            f"{per_gpu} worker(s) per GPU allowed. Run with -n {len(visible) * per_gpu} or fewer: timed perf rows "
            f"must share their GPU with no other test ({WORKERS_PER_GPU_ENV} allows more for untimed layers)."
        )
    return visible[k % len(visible)]
