"""Where a profiled call leaves the GPU idle: the gaps between its device operations in a torch.profiler
Chrome trace, the longest first, each told as host-bound or not.

A gap is host-bound when the operation after it was launched only after the GPU had run dry (the host was
still busy: Python, the dispatcher, a library's planning): faster kernels cannot win that time back, CUDA
graphs or less host work can. A gap whose next operation was launched early is the device waiting on its
own (a dependency or a synchronization). 5d2f225's profile measured 2.9 ms of hiera_l's 39.5 ms encoder call (H200,
compile mode default) as time between kernels, without telling which.

    gaps(trace_events) -> [Gap(idle_us=812.0, after="nvjet_...", before="triton_per_...", launched_late_us=790.0,
                               host_op="aten::_scaled_dot_product_cudnn_attention"), ...]
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, replace

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # torch and cuBLAS launch through the runtime, Triton the driver


@dataclass(frozen=True)
class Gap:
    idle_us: float  # from the end of one device operation to the start of the next
    after: str  # the operation the GPU had finished
    before: str  # the operation it waited for
    launched_late_us: float  # how long after the GPU ran dry the host launched `before` (0: launched in time)
    host_op: str  # the innermost operator on the host around that launch ("" if the trace names none)

    @property
    def host_bound(self) -> bool:
        return self.launched_late_us > 0.5 * self.idle_us


def gaps(trace_events: list[dict], min_us: float = 1.0, name_host_ops: int = 8) -> list[Gap]:
    """Every idle stretch of at least min_us between consecutive device operations (one timeline: the
    profiled calls run on one stream), the longest first; the host operator is looked up for the
    `name_host_ops` longest (a call has a thousand gaps of a microsecond or two)."""
    device = sorted((e for e in trace_events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES),
                    key=lambda e: float(e["ts"]))
    launches = {e["args"]["correlation"]: e for e in trace_events
                if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in (e.get("args") or {})}
    found = []
    for previous, current in itertools.pairwise(device):
        dry_at = float(previous["ts"]) + float(previous.get("dur", 0.0))
        idle = float(current["ts"]) - dry_at
        if idle < min_us:
            continue
        launch = launches.get((current.get("args") or {}).get("correlation"))
        late = max(0.0, float(launch["ts"]) - dry_at) if launch is not None else 0.0
        found.append((Gap(idle, previous["name"], current["name"], late, ""), launch))
    found.sort(key=lambda gap_launch: gap_launch[0].idle_us, reverse=True)
    host_ops = sorted((e for e in trace_events if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                      key=lambda e: float(e["ts"]))
    starts = [float(e["ts"]) for e in host_ops]
    return [replace(gap, host_op=_innermost_op(host_ops, starts, launch)) if i < name_host_ops and launch else gap
            for i, (gap, launch) in enumerate(found)]


def _innermost_op(host_ops: list[dict], starts: list[float], launch: dict) -> str:
    """The shortest cpu_op of the launching thread whose span holds the launch (host_ops sorted by start)."""
    at = float(launch["ts"])
    holding = [e for e in host_ops[: bisect.bisect_right(starts, at)]
               if e.get("tid") == launch.get("tid") and float(e["ts"]) + float(e.get("dur", 0.0)) >= at]
    return min(holding, key=lambda e: float(e.get("dur", 0.0)))["name"] if holding else ""


def summary(found: list[Gap], calls: int, top: int = 8) -> dict:
    """Idle time per call (all of it, and the host-bound part) and the `top` longest gaps."""
    return {
        "idle_us_per_call": sum(g.idle_us for g in found) / calls,
        "host_bound_us_per_call": sum(g.idle_us for g in found if g.host_bound) / calls,
        "gaps_per_call": len(found) / calls,
        "longest": [{"idle_us": g.idle_us, "after": g.after, "before": g.before,
                     "launched_late_us": g.launched_late_us, "host_op": g.host_op} for g in found[:top]],
    }
