"""Did a stage's switches really run? A switch that silently did nothing must not be reported "pass".

The runner builds and runs the stage inside `watch_switches`, handing it the built model (`use.watch`) before
the run. The watcher puts cheap observers on the model for the switches that apply, and when the block
exits, each switch's proof (parity.checks.switch_proofs) reads the model and what the run did:

* observers: forward hooks (encoder blocks' output dtype, the modules holding replaced linears, the prompt
  decoder's calls) and a F.scaled_dot_product_attention that notes it ran. Under torch.compile they are
  traced into the graph; they only store into containers filled before the run, never read them, so
  dynamo guards on none of them and nothing recompiles. They are removed when the block exits.
* counters kept elsewhere: samfast.kernels counts each call a Triton kernel sent to its reference path
  (the reason is a property of the model, so one fallback means the switch went untested); dynamo's
  counters["stats"]["unique_graphs"] counts the graphs compiled. torch.compile under TORCHDYNAMO_DISABLE=1
  is a silent no-op, and dynamo reuses a graph compiled for an earlier instance of the same module class
  (which would count 0 for a stage that did compile), so its caches are reset first.

A switch the task ignores by design (Task.ignored_switches) is "not applicable": named, never proven.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterator

import torch
import torch.nn.functional as F

from parity.checks.switch_proofs import PROOFS, RunTrace, linear_holders
from samfast import kernels

REPLACING_LINEARS = ("int8", "sparse", "fp8")
NOTHING_IGNORED: Mapping[str, str] = MappingProxyType({})


@dataclass
class SwitchUse:
    """What the switches did while a stage ran; filled in when the `watch_switches` block exits."""

    switches: frozenset[str]  # the stage's switches that apply to the task
    exercised: list[str] = field(default_factory=list)  # one sentence per switch that ran: what shows it
    not_exercised: list[str] = field(default_factory=list)  # one sentence per switch that did not run
    not_applicable: dict[str, str] = field(default_factory=dict)  # switch -> why the task ignores it
    model: torch.nn.Module | None = None
    trace: RunTrace = field(default_factory=RunTrace)
    _observers: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def kernel_fallbacks(self) -> dict[str, int]:
        """Reason -> calls a Triton kernel sent to its reference path (visible in reports whatever the switches)."""
        return self.trace.kernel_fallbacks

    @property
    def graphs_compiled(self) -> int | None:
        """Graphs torch.compile compiled; None when the stage has no compile switch."""
        return self.trace.graphs_compiled if "compile" in self.switches else None

    def record(self, result, exercise_required: bool) -> None:
        """Put what the switches did on the stage's result (a parity.compare.gates.StageResult)."""
        result.exercised, result.not_exercised = self.exercised, self.not_exercised
        result.not_applicable, result.exercise_required = self.not_applicable, exercise_required

    def watch(self, model: torch.nn.Module) -> torch.nn.Module:
        """Observe this built model's run (call before running it); returns the model."""
        self.model = model
        _observe(model, self.switches, self.trace, self._observers)
        return model


@contextlib.contextmanager
def watch_switches(switches: frozenset[str], ignored: Mapping[str, str] = NOTHING_IGNORED) -> Iterator[SwitchUse]:
    """Watch a stage with these switches being built and run inside the block; `ignored`: switch -> why
    the task does not read it (those are "not applicable", not proven)."""
    use = SwitchUse(switches - ignored.keys(),
                    not_applicable={s: why for s, why in ignored.items() if s in switches})
    kernels.reset_fallback_counts()
    if "compile" in use.switches:
        torch._dynamo.reset()
        graphs_before = _graphs_compiled_so_far()
    with use._observers:
        yield use
    use.trace.kernel_fallbacks = dict(kernels.fallback_counts())
    if "compile" in use.switches:
        use.trace.graphs_compiled = _graphs_compiled_so_far() - graphs_before
    if use.model is None:
        raise RuntimeError("watch_switches: the runner never handed the built model to use.watch(model)")
    for switch in sorted(use.switches, key=list(PROOFS).index):
        ran, sentence = PROOFS[switch](use.model, use.trace, use.switches)
        (use.exercised if ran else use.not_exercised).append(sentence)


def _graphs_compiled_so_far() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _observe(model, switches: frozenset[str], trace: RunTrace, observers: contextlib.ExitStack) -> None:
    """Put on `model` the observers the proofs of `switches` read; `observers` removes them."""
    if "sdpa" in switches:
        observers.enter_context(_noting_sdpa(trace.sdpa))
    if "bf16" in switches:
        for name, block in model.encoder_blocks().items():
            trace.block_dtypes[name] = None
            observers.callback(block.register_forward_hook(_store_dtype(trace.block_dtypes, name)).remove)
    if switches & set(REPLACING_LINEARS):
        for name in linear_holders(model, model.encoder_linears()):
            trace.holders_ran[name] = False
            observers.callback(model.get_submodule(name).register_forward_hook(_store_ran(trace.holders_ran, name)).remove)
    if "nt" in switches:
        def count(module, args, kwargs):  # the predictor passes image_index for a batch's nested prompts
            trace.decoder_calls["per_image" if kwargs.get("image_index") is None else "nested"] += 1

        observers.callback(model.prompt_decoder().register_forward_pre_hook(count, with_kwargs=True).remove)


def _store_dtype(dtypes: dict, name: str):
    def hook(module, args, output):
        dtypes[name] = output.dtype

    return hook


def _store_ran(ran: dict, name: str):
    def hook(module, args, output):
        ran[name] = True

    return hook


@contextlib.contextmanager
def _noting_sdpa(seen: dict[str, bool]) -> Iterator[None]:
    """F.scaled_dot_product_attention that notes it ran (samfast calls it as F.scaled_dot_product_attention)."""
    original = F.scaled_dot_product_attention

    def noted(*args, **kwargs):
        seen["called"] = True
        return original(*args, **kwargs)

    F.scaled_dot_product_attention = noted
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
