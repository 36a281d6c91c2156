"""What every hand-written kernel shares: the interpreter switch, the launcher, and counted fallbacks.

A kernel that cannot serve a call (no Triton, CPU tensors without TRITON_INTERPRET=1, a dtype or
shape it does not handle, autograd) runs its PyTorch reference instead; the reason is counted in
:data:`FALLBACK_COUNTS` and logged once, so a stage whose kernels silently stopped running shows
up in the parity gate (parity.checks.exercised) instead of passing on the slow path.
"""

from __future__ import annotations

import collections
import logging
import os

import torch

# Triton is Linux-only; without it every call takes the counted fallback. The kernel modules take
# triton and tl from here.
try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

logger = logging.getLogger("samfast.kernels")

#: Calls that took a reference path instead of a kernel, keyed by reason.
FALLBACK_COUNTS: collections.Counter[str] = collections.Counter()
_LOGGED: set[tuple[str, str]] = set()

GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INTERPRETER_DTYPES = (torch.float16, torch.float32)  # the interpreter's tl.dot has no bf16


def fallback_counts() -> dict[str, int]:
    """How often each fallback reason sent a call to a reference path (a copy)."""
    return dict(FALLBACK_COUNTS)


def reset_fallback_counts() -> None:
    """Zero the counters and let every reason log its warning once more."""
    FALLBACK_COUNTS.clear()
    _LOGGED.clear()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def launcher():
    """How to launch a kernel now: wrapped for torch.compile, or as is under the interpreter
    (older torch's wrap_triton refuses an interpreted kernel)."""
    return (lambda kern: kern) if interpreting() else torch.library.wrap_triton


def loop_bound(n: int):
    """A kernel argument that serves only as a loop's runtime bound (`for i in range(0, N)`), as the
    launch must pass it: n itself for the compiled kernel, n as a constexpr under the interpreter, where
    range() then takes it as is. Triton 3.6's interpreter makes an int argument a one-element array,
    which its range() turns into an index with int(), and numpy >= 2.4 refuses that ("only
    0-dimensional arrays can be converted to Python scalars"); Triton 3.8 squeezes the array first.
    Either way the loop counter is a Python int there, so the interpreted loop is the same on both."""
    return tl.constexpr(n) if interpreting() else n


def dot_precision(dtype: torch.dtype) -> str | None:
    """The kernels' tl.dot input_precision for inputs of this dtype: "ieee" for fp32 (the fp32 paths
    match their float64 references to ~1e-7, which tf32 would not), else None (Triton's default)."""
    return "ieee" if dtype == torch.float32 else None


def is_power_of_2(n: int, at_least: int = 1) -> bool:
    """n a power of 2 and at least `at_least` (16: tl.dot's smallest width): the widths a kernel tiles as is."""
    return n >= at_least and n & (n - 1) == 0


class TritonKernel:
    """One kernel body, compiled (autotuned over `configs`, keyed on `key`) or interpreted, chosen per call.

    Built explicitly (not via @triton.jit) so the choice follows TRITON_INTERPRET at each call,
    not once at import time. Without Triton both are None (every call takes the counted fallback).
    """

    def __init__(self, fn, configs, key: list[str]) -> None:
        self.compiled = self.interpreted = None
        if triton is not None:
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction

            self.compiled = triton.autotune(configs=configs, key=key)(JITFunction(fn))
            self.interpreted = InterpretedFunction(fn)

    def pick(self, **interpret_meta):
        """(kernel, meta) for a call now: interpreted with these fixed block sizes (no autotuning
        there), or the autotuned compiled kernel."""
        return (self.interpreted, interpret_meta) if interpreting() else (self.compiled, {})


def unsupported_reason(tensors) -> str | None:
    """Why no Triton kernel can take these tensors (device, dtype, autograd), or None.

    The first tensor sets the device and dtype the others must share; kernels add their own
    shape checks after this one.
    """
    if triton is None:
        return "triton is not installed"
    interpret = interpreting()
    if interpret and torch.compiler.is_compiling():
        return "TRITON_INTERPRET under torch.compile"
    first = tensors[0]
    if not interpret and first.device.type != "cuda":
        return f"{first.device.type} tensors without TRITON_INTERPRET=1"
    if any(t.device != first.device for t in tensors):
        return "inputs on different devices"
    if any(t.dtype != first.dtype for t in tensors):
        return "inputs of mixed dtypes"
    allowed = INTERPRETER_DTYPES if interpret else GPU_DTYPES
    if first.dtype not in allowed:
        where = "the Triton interpreter" if interpret else "the kernel"
        return f"dtype {str(first.dtype).removeprefix('torch.')} not supported by {where}"
    if not interpret and first.dtype == torch.bfloat16 and torch.cuda.get_device_capability(first.device)[0] < 8:
        return "bfloat16 needs compute capability 8.0 or newer"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "autograd (the kernel has no backward)"
    return None


# Under torch.compile this runs once per trace, at trace time (dynamo treats its result as a
# constant), instead of breaking the graph: compiled code counts a fallback once per compile.
@torch.compiler.assume_constant_result
def note_fallback(kernel: str, reason: str, instead: str) -> bool:
    FALLBACK_COUNTS[reason] += 1
    if (kernel, reason) not in _LOGGED:
        _LOGGED.add((kernel, reason))
        logger.warning("%s: %s; using %s", kernel, reason, instead)
    return True
