"""What every benchmark here measures the same way: a device sync, the median time of a call, graphs
compiled while timed, peak memory, freeing between configurations, the device's name, the clock and
the command a report names, and how a figure is printed."""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from parity.checks.compile import watch


# --- timing --------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device: torch.device, *, warmup: int, iters: int, repeats: int) -> float:
    """Median seconds per call over `repeats` runs of `iters` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeats):
        sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            runs.append((time.perf_counter() - t0) / iters)
    return statistics.median(runs)


def clock_name(device: torch.device) -> str:
    """The clock time_call reads on this device, as a report names it."""
    return "CUDA events" if device.type == "cuda" else "perf_counter"


@contextlib.contextmanager
def counting_compiles(notes: dict):
    """Around a timed region: adds the graphs torch.compile built inside it to notes["compiled_while_timed"].
    Anything compiled after the warm-up (a recompile) makes the figure compile time; timed_compile_note
    says so in the row (an H100 video row read 6.5 fps that way, with nothing saying so)."""
    with watch() as seen:
        yield
    notes["compiled_while_timed"] = notes.get("compiled_while_timed", 0) + seen.graphs_compiled


def timed_compile_note(notes: dict) -> str:
    """The row's note when its timed region compiled ("" when not)."""
    graphs = notes.get("compiled_while_timed", 0)
    if not graphs:
        return ""
    return (f"**{graphs} graph(s) compiled while timed**: a recompile after the warm-up, the figure includes "
            "compiling (TORCH_LOGS=recompiles names it)")


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def free(device: torch.device) -> None:
    gc.collect()
    torch._dynamo.reset()  # every compiled encoder shares nn.Module._call_impl's code: keep its cache clean
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_configurations(rows: Sequence, device: torch.device, run_group: Callable[[list], None],
                       summary: Callable[[object], str], save: Callable[[], object]) -> None:
    """Each configuration's rows (one model, implementation and stage, in plan order) through run_group,
    the memory freed after each, a line per row on stderr, and save() after each configuration: a
    killed run keeps what it has."""
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row.model, row.impl, row.stage), []).append(row)
    for group in groups.values():
        try:
            run_group(group)
        finally:
            free(device)
        for row in group:
            print(summary(row), file=sys.stderr, flush=True)
        save()


def command_line(module: str, argv: Sequence[str]) -> str:
    """The command a report names, so it can be rerun as written: `python -m module` and the arguments
    the bench's main was given (not sys.argv: a test calls main with its own), quoted for a shell."""
    return shlex.join(["python", "-m", module, *argv])


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
