"""How the gate's GPU processes wait for the GPU: asleep in the driver, or spinning a core.

CUDA's default schedule (CU_CTX_SCHED_AUTO) spins a core for every thread waiting on the GPU whenever
the process has fewer CUDA contexts than the machine has cores: always, here. The gate runs 4 GPU-layer
workers, 3 checks and perf on one GPU beside 13 CPU-layer workers, so each wait is long (the GPU is
shared) and every spinning waiter takes a core from a step that has work (docs/gpu-gate.md: on a
warm 16-core H100 gate, the 4 GPU-layer workers held ~3 cores each). PyTorch has no switch for it
(pytorch/pytorch#28224), so this sets the primary context's schedule through the driver API before
PyTorch creates the context; PyTorch then uses that context as it is.

SAMFAST_GPU_WAIT names the schedule: `block` (sleep until the GPU is done), `yield`, `spin`, or `auto`
(CUDA's default, nothing set). The gate sets it for its steps; a process that reads it calls apply()
before its first CUDA call (tests/conftest.py, the gate's check steps).
"""

from __future__ import annotations

import ctypes
import os

WAIT_ENV = "SAMFAST_GPU_WAIT"
# The gate's choice (parity.gate.run) unless SAMFAST_GPU_WAIT is set.
GATE_DEFAULT = "block"
# CUctx_flags' scheduling bits (cuda.h); auto is 0: nothing to set.
SCHEDULES = {"auto": 0x0, "spin": 0x1, "yield": 0x2, "block": 0x4}
SCHEDULE_MASK = 0x7
CUDA_ERROR_NO_DEVICE = 100  # cuInit's answer where CUDA_VISIBLE_DEVICES hides every GPU (the CPU layers)


class GpuWaitError(RuntimeError):
    """SAMFAST_GPU_WAIT could not be applied (a bad value, or CUDA started before it)."""


def _driver():
    """The CUDA driver library, or None on a machine without one (nothing to set there)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def _call(driver, name: str, *args) -> None:
    code = getattr(driver, name)(*args)
    if code != 0:
        raise GpuWaitError(f"{name} returned CUDA error {code}; unset {WAIT_ENV} (or set it to auto) to keep CUDA's "
                           "default wait")


def schedule_named(env=os.environ) -> str:
    """The schedule SAMFAST_GPU_WAIT names (`auto` when unset); GpuWaitError for a name CUDA has not."""
    name = env.get(WAIT_ENV, "").strip().lower() or "auto"
    if name not in SCHEDULES:
        raise GpuWaitError(f"{WAIT_ENV}={env[WAIT_ENV]!r} is not one of {', '.join(SCHEDULES)}")
    return name


def apply(env=os.environ, driver=None) -> str | None:
    """Give every visible GPU's primary context the schedule SAMFAST_GPU_WAIT names.

    Returns what was done, for the gate's notes, or None when there was nothing to do (unset, `auto`,
    or no CUDA driver or no visible GPU in this process). Call it after CUDA_VISIBLE_DEVICES is final. Raises GpuWaitError for an unknown name, and when a GPU's
    primary context is already running (the schedule would not change: call this before CUDA starts).
    """
    name = schedule_named(env)
    if name == "auto":
        return None
    driver = driver or _driver()
    if driver is None or driver.cuInit(0) == CUDA_ERROR_NO_DEVICE:
        return None
    _call(driver, "cuInit", 0)
    count = ctypes.c_int()
    _call(driver, "cuDeviceGetCount", ctypes.byref(count))
    for ordinal in range(count.value):
        device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        _call(driver, "cuDeviceGet", ctypes.byref(device), ordinal)
        _call(driver, "cuDevicePrimaryCtxGetState", device, ctypes.byref(flags), ctypes.byref(active))
        if active.value and flags.value & SCHEDULE_MASK != SCHEDULES[name]:
            raise GpuWaitError(f"{WAIT_ENV}={name}: GPU {ordinal}'s CUDA context already runs (set it before the "
                               "first CUDA call of the process)")
        _call(driver, "cuDevicePrimaryCtxSetFlags_v2", device, (flags.value & ~SCHEDULE_MASK) | SCHEDULES[name])
    return f"GPU waits: {name} ({WAIT_ENV}), on {count.value} GPU(s)"


def current_schedule(driver=None) -> str | None:
    """The schedule GPU 0's primary context has now (proof that apply() took), or None without a driver."""
    driver = driver or _driver()
    if driver is None:
        return None
    _call(driver, "cuInit", 0)
    device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    _call(driver, "cuDeviceGet", ctypes.byref(device), 0)
    _call(driver, "cuDevicePrimaryCtxGetState", device, ctypes.byref(flags), ctypes.byref(active))
    return {bits: name for name, bits in SCHEDULES.items()}.get(flags.value & SCHEDULE_MASK, hex(flags.value))
