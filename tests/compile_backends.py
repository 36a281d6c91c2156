"""A compile test run twice: traced by aot_eager in the CPU run, compiled by inductor on the GPU runners.

aot_eager checks what dynamo and AOTAutograd decide (graphs, guards, recompiles) and what the traced graphs
compute; inductor adds its generated code, whose C++ compile costs minutes of a 2-core machine, so that
run is left to the GPU runners' gate (parity.gate.gpu_runner). Parametrize the test's `compile_backend`
fixture (tests/conftest.py) with these, indirectly.
"""

from __future__ import annotations

import pytest


def aot_eager_and_inductor(*, inductor_slow: str, gpu_runner: str, aot_eager_slow: str | None = None) -> list:
    """The [aot_eager] and [inductor] parameters: each slow reason for its run (aot_eager's only where it
    needs one), and gpu_runner the reason the CPU run leaves inductor's to the GPU runners."""
    aot_eager_marks = [pytest.mark.slow(reason=aot_eager_slow)] if aot_eager_slow else []
    return [pytest.param("aot_eager", marks=aot_eager_marks),
            pytest.param("inductor", marks=[pytest.mark.slow(reason=inductor_slow),
                                            pytest.mark.gpu_runner(reason=gpu_runner)])]
