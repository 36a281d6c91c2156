"""CPU tests too slow for a 2-core machine, which only the GPU runners' gate runs.

A test marked `@pytest.mark.gpu_runner(reason="...")` needs no GPU, but minutes of CPU (inductor's C++
compile of a whole tracker, a full-size model in fp32) on the 2-core machines that run `nox -s tests` and
CI. The GPU runner's gate (`python -m parity.gate --require-gpu`) runs it in its CPU layers, over many
cores; any run with a CUDA device does too. Elsewhere it skips, its reason and where it runs in the skip
line. Each such test keeps a cheaper sibling in the CPU run where one can prove the same claim (the
front end's graphs under aot_eager, a full-size layout on the meta device): its reason names it.
"""

from __future__ import annotations

MARKER = "gpu_runner"
WHERE = "python -m parity.gate --require-gpu, or pytest --require-gpu"


class MissingReason(ValueError):
    """A gpu_runner test without its reason: the skip line would not say why the CPU run leaves it out."""


def skip_reason(marker, *, on_gpu_runner: bool) -> str | None:
    """The skip reason of a test with `marker` (a pytest Mark, or None for an unmarked test), None if it runs.

    on_gpu_runner: the run has a CUDA device or was given --require-gpu (the gate passes it to its CPU
    layers, which see no GPU)."""
    if marker is None:
        return None
    reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
    if not reason:
        raise MissingReason(f"@pytest.mark.{MARKER} needs reason=\"...\": why the 2-core CPU run leaves the test "
                            "to the GPU runners, and which test there proves what it can")
    if on_gpu_runner:
        return None
    return f"on the GPU runners' gate only ({WHERE}): {reason}"
