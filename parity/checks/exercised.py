"""Did a stage's switches really run? A switch that silently did nothing must not be reported "pass".

Two switches can do nothing without raising:

* triton: the fused rel-pos kernel sends a call it cannot serve (CPU tensors without
  TRITON_INTERPRET=1, an unsupported dtype or head dim) to the materialized-bias reference path.
  samfast.kernels counts each such call by reason. The reason is a property of the model (device,
  dtype, head dim: the same for every block), so one fallback means the switch went untested.
* compile: torch.compile under TORCHDYNAMO_DISABLE=1 is a silent no-op (even with fullgraph=True), and
  one that falls back to eager compiles no graph. dynamo's counters["stats"]["unique_graphs"] counts the graphs
  it compiled. dynamo reuses a graph compiled for an earlier instance of the same module class, which
  would count 0 for a stage that did compile, so its caches are reset first: each stage is counted afresh.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from samfast import kernels


@dataclass
class SwitchUse:
    """What the switches did while a stage ran; filled in when the `watch_switches` block exits."""

    kernel_fallbacks: dict[str, int] = field(default_factory=dict)  # reason -> calls sent to the slow path
    graphs_compiled: int | None = None  # None: the stage has no compile switch
    not_exercised: list[str] = field(default_factory=list)  # one sentence per switch that did not run


def _graphs_compiled_so_far() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@contextlib.contextmanager
def watch_switches(switches: frozenset[str]) -> Iterator[SwitchUse]:
    """Watch a stage with these switches being built and run inside the block."""
    use = SwitchUse()
    kernels.reset_fallback_counts()
    if "compile" in switches:
        torch._dynamo.reset()
        graphs_before = _graphs_compiled_so_far()
    yield use
    use.kernel_fallbacks = dict(kernels.fallback_counts())
    if "triton" in switches and use.kernel_fallbacks:
        reasons = ", ".join(f"{n}x {reason}" for reason, n in use.kernel_fallbacks.items())
        use.not_exercised.append(f"a Triton kernel fell back to its reference path ({reasons})")
    if "compile" in switches:
        use.graphs_compiled = _graphs_compiled_so_far() - graphs_before
        if use.graphs_compiled == 0:
            use.not_exercised.append("torch.compile compiled no graph: the model ran eagerly "
                                     "(TORCHDYNAMO_DISABLE=1 or a fallback to eager)")
