"""Find host-device syncs in a profiled region, and say which op and which line caused each.

A sync (``.item()``, ``.cpu()``, ``print(tensor)``, a data-dependent shape) makes the CPU wait for
the GPU, so the CPU stops running ahead and launch overhead lands on the critical path. Syncs show
up in a torch.profiler chrome trace as CUDA runtime/driver calls; this module finds them and maps
each to the innermost aten op and the innermost user Python frame around it on the same thread.

Convention: the timed region runs inside ``record_function("parity.timed_region")`` and ends with
the one deliberate sync inside ``record_function("parity.final_sync")``; ``profile_region`` does
both for you. Only syncs inside the timed region count (if the trace has one), and syncs inside an
allowed annotation are excluded.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

TIMED_REGION = "parity.timed_region"
FINAL_SYNC = "parity.final_sync"
PERFETTO = "https://ui.perfetto.dev"

# Blocking runtime/driver calls. Async copies are not listed: a copy the host waits for is
# followed by a stream sync (that is what .item() does), which is reported itself. Suffixes:
# _v2 (driver API versions), _ptsz/_ptds (per-thread default stream builds).
_SYNC_CALL = re.compile(
    r"^(?:cuda(?:StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy(?:2D|3D)?|"
    r"Memcpy(?:To|From)Symbol)"
    r"|cu(?:StreamSynchronize|CtxSynchronize|EventSynchronize|Memcpy(?:DtoH|HtoD|DtoD)?))"
    r"(?:_v\d+)?(?:_pt(?:sz|ds))?$"
)
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
# The python tracer names frames "file(line): func" with file relative to its sys.path entry
# ("torch/nn/modules/module.py", "typing.py"), so library frames are told by their first part.
_FRAME_NAME = re.compile(r"^(.+?)\((\d+)\): (.+)$")
_LIBRARY_PACKAGES = {"torch", "triton", "torchao", "numpy"} | set(sys.stdlib_module_names)


def _is_user_file(path: str) -> bool:
    if path.startswith("<") or re.search(r"(site|dist)-packages/|/lib/python\d", path):
        return False
    first = path.lstrip("./").split("/", 1)[0]
    return first.removesuffix(".py") not in _LIBRARY_PACKAGES


def profile_region(fn: Callable[[], Any], *, trace_path: str | Path, warmup: int = 1) -> Path:
    """Run ``fn`` once under torch.profiler and write a chrome trace (``.json`` or ``.json.gz``).

    ``fn`` runs ``warmup`` times first, unprofiled, so compilation and autotuning stay out of the
    trace. The profiled call is wrapped in the timed-region annotation and followed by the one
    allowed ``torch.cuda.synchronize()``, annotated as the final sync. Without CUDA only CPU
    activity is recorded (useful for tests of the plumbing).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, with_stack=True, record_shapes=False) as prof:
        with record_function(TIMED_REGION):
            fn()
            with record_function(FINAL_SYNC):
                if cuda:
                    torch.cuda.synchronize()
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace_path))
    return trace_path


def load_trace(trace: str | Path | dict) -> dict:
    """A chrome trace as a dict, from a dict, a ``.json`` file or a ``.json.gz`` file."""
    if isinstance(trace, dict):
        return trace
    path = Path(trace)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return {"traceEvents": data} if isinstance(data, list) else data


def is_sync_call(event: dict) -> bool:
    """Whether a profiler event is a blocking CUDA runtime or driver call (a host-device sync)."""
    return event.get("cat") in _RUNTIME_CATS and bool(_SYNC_CALL.match(event.get("name", "")))


def _spans(events: list[dict], cat: str) -> list[dict]:
    return [e for e in events if e.get("cat") == cat]


def encloses(outer: dict, inner: dict) -> bool:
    """Whether `inner` runs inside `outer`: the same process and thread, its start within outer's span."""
    # Timestamps are rounded to 1 ns in the export; compare the inner event's start only.
    start = float(outer["ts"])
    return (
        outer.get("pid") == inner.get("pid")
        and outer.get("tid") == inner.get("tid")
        and start <= float(inner["ts"]) <= start + float(outer.get("dur", 0))
    )


def _innermost(candidates: list[dict], event: dict) -> dict | None:
    around = [c for c in candidates if encloses(c, event)]
    # Latest start is innermost; among equal starts, the shortest.
    return max(around, key=lambda c: (float(c["ts"]), -float(c.get("dur", 0))), default=None)


def _user_frame(frames: list[dict], event: dict) -> str | None:
    """The innermost user function around ``event``, as "file:line (in func)" with the exact
    line when the trace has the frame it called (its CallFrom), else as "file(def line): func"."""
    around = [f for f in frames if encloses(f, event)]
    around.sort(key=lambda f: (float(f["ts"]), -float(f.get("dur", 0))), reverse=True)
    for inner, f in zip([None] + around, around):  # innermost first, with the frame it called
        m = _FRAME_NAME.match(f["name"])
        if m and _is_user_file(m.group(1)):
            call_from = (inner or {}).get("args", {}).get("CallFrom", "")
            if call_from.startswith(m.group(1) + ":"):
                return f"{call_from} (in {m.group(3)})"
            return f["name"]
    # No user code around it: name the module or library frame, better than nothing.
    modules = [f for f in around if f["name"].startswith("nn.Module:")]
    return (modules or around or [{"name": None}])[0]["name"]

def find_syncs(
    trace: str | Path | dict,
    *,
    allowed: tuple[str, ...] = (FINAL_SYNC,),
    region: str | None = TIMED_REGION,
) -> list[dict]:
    """Every blocking CUDA call in the timed region, with the aten op and user frame behind it.

    Each entry: ``name``, ``ts`` and ``dur`` (microseconds), ``aten_op`` and ``python_frame``
    (None where the trace has none around it). Syncs inside a user annotation named in
    ``allowed`` are left out. If the trace has a ``region`` annotation, syncs outside it are left
    out too; with none (or ``region=None``), the whole trace counts. Returns [] when clean.
    """
    events = [e for e in load_trace(trace).get("traceEvents", []) if e.get("ph") == "X"]
    annotations = _spans(events, "user_annotation")
    regions = [a for a in annotations if region and a["name"] == region]
    excused = [a for a in annotations if a["name"] in allowed]
    cpu_ops, frames = _spans(events, "cpu_op"), _spans(events, "python_function")

    found = []
    for e in events:
        if not is_sync_call(e):
            continue
        if regions and not any(encloses(r, e) for r in regions):
            continue
        if any(encloses(a, e) for a in excused):
            continue
        op = _innermost(cpu_ops, e)
        found.append(
            {
                "name": e["name"],
                "ts": float(e["ts"]),
                "dur": float(e.get("dur", 0)),
                "aten_op": op["name"] if op else None,
                "python_frame": _user_frame(frames, e),
            }
        )
    return found


def format_syncs(syncs: list[dict], trace_path: str | Path | None = None) -> str:
    where = f" in {trace_path} (open in {PERFETTO})" if trace_path else ""
    lines = [f"{len(syncs)} host-device sync(s) in the timed region{where}:"]
    for s in syncs:
        lines.append(
            f"  {s['name']} {s['dur']:.1f} us  op={s['aten_op'] or '?'}  "
            f"at {s['python_frame'] or 'unknown python frame'}"
        )
    lines.append(
        "Each one stalls the CPU until the GPU catches up. Keep values on the device "
        "(torch.where instead of indexing by a tensor, no .item()/.cpu()/print in the hot path)."
    )
    return "\n".join(lines)


def assert_no_syncs(
    trace: str | Path | dict,
    *,
    allowed: tuple[str, ...] = (FINAL_SYNC,),
    region: str | None = TIMED_REGION,
) -> None:
    """Raise AssertionError listing every sync ``find_syncs`` finds, with where to look."""
    syncs = find_syncs(trace, allowed=allowed, region=region)
    if syncs:
        path = None if isinstance(trace, dict) else trace
        raise AssertionError(format_syncs(syncs, path))


@contextlib.contextmanager
def sync_debug_mode(mode: str | int = "error") -> Iterator[None]:
    """Make PyTorch raise (``"error"``) or warn (``"warn"``) at a sync, then restore the old mode.

    Faster than profiling and points at the exact Python line, but it only sees syncs that go
    through PyTorch's checked paths (``.item()``, ``nonzero``, copies to the host made by
    ``Tensor.to``...). It misses ``cudaEventSynchronize``, some copies, and syncs made by
    extensions or libraries, so the profiler trace (``find_syncs``) stays the gate.
    """
    import torch

    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
