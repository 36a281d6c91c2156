"""parity.gate.gpu_wait against a stand-in CUDA driver: which flags reach each GPU, and the refusals.

The real driver is exercised on the GPU runner (tests/gpu/test_gpu_wait_gpu.py); CI has none.
"""

from __future__ import annotations

import pytest

from parity.gate import gpu_wait


class StandInDriver:
    """The five driver calls gpu_wait makes, over `gpus` primary contexts ({"flags", "active"} each)."""

    def __init__(self, gpus: int = 1, flags: int = 0x0, active: bool = False, init_code: int = 0):
        self.contexts = [{"flags": flags, "active": active} for _ in range(gpus)]
        self.init_code = init_code

    def cuInit(self, _flags):
        return self.init_code

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.contexts)
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, device, flags, active):
        context = self.contexts[device.value]
        flags._obj.value, active._obj.value = context["flags"], int(context["active"])
        return 0

    def cuDevicePrimaryCtxSetFlags_v2(self, device, flags):
        self.contexts[device.value]["flags"] = flags
        return 0


@pytest.mark.parametrize("name, bits", [("block", 0x4), ("yield", 0x2), ("spin", 0x1), (" Block ", 0x4)])
def test_every_gpu_gets_the_named_schedule(name, bits):
    driver = StandInDriver(gpus=2, flags=0x8)  # another flag (CU_CTX_MAP_HOST) is kept
    note = gpu_wait.apply({gpu_wait.WAIT_ENV: name}, driver)
    assert [c["flags"] for c in driver.contexts] == [0x8 | bits] * 2
    assert note.startswith(f"GPU waits: {name.strip().lower()}") and "2 GPU(s)" in note
    assert gpu_wait.current_schedule(driver) == name.strip().lower()


@pytest.mark.parametrize("env", [{}, {gpu_wait.WAIT_ENV: ""}, {gpu_wait.WAIT_ENV: "auto"}])
def test_auto_or_unset_touches_nothing(env):
    driver = StandInDriver(flags=0x1)
    assert gpu_wait.apply(env, driver) is None
    assert driver.contexts[0]["flags"] == 0x1


def test_a_process_without_visible_gpus_is_left_alone():
    driver = StandInDriver(init_code=gpu_wait.CUDA_ERROR_NO_DEVICE)  # CUDA_VISIBLE_DEVICES="" (the CPU layers)
    assert gpu_wait.apply({gpu_wait.WAIT_ENV: "block"}, driver) is None


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(gpu_wait.GpuWaitError, match=r"'sleep' is not one of auto, spin, yield, block"):
        gpu_wait.apply({gpu_wait.WAIT_ENV: "sleep"}, StandInDriver())


def test_a_running_context_is_refused_rather_than_left_spinning():
    driver = StandInDriver(active=True)
    with pytest.raises(gpu_wait.GpuWaitError, match="already runs.*before the first CUDA call"):
        gpu_wait.apply({gpu_wait.WAIT_ENV: "block"}, driver)
    # the same schedule on a running context is no change: accepted
    assert gpu_wait.apply({gpu_wait.WAIT_ENV: "auto"}, driver) is None
    driver.contexts[0]["flags"] = 0x4
    assert gpu_wait.apply({gpu_wait.WAIT_ENV: "block"}, driver)


def test_a_driver_error_names_the_call_and_the_way_out():
    driver = StandInDriver(init_code=3)  # CUDA_ERROR_NOT_INITIALIZED
    with pytest.raises(gpu_wait.GpuWaitError, match=rf"cuInit returned CUDA error 3; unset {gpu_wait.WAIT_ENV}"):
        gpu_wait.apply({gpu_wait.WAIT_ENV: "block"}, driver)
