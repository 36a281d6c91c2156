"""CPU tests left to the GPU runners' gate (parity.gate.gpu_runner): skipped with their reason on a CPU-only
run, run under --require-gpu (which the gate gives its CPU layers) or with a CUDA device."""

from __future__ import annotations

import types

import pytest
import torch

from parity.gate import gpu_runner
from parity.gate.run import pytest_commands
from tests import conftest

REASON = "a planted reason"


class Item:
    """What the collection hook reads of a pytest item."""

    def __init__(self, *marks):
        self.marks = [m.mark for m in marks]
        self.keywords = {m.name for m in self.marks}

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, mark):
        self.marks.append(mark.mark)

    def skip_reasons(self) -> list[str]:
        return [m.kwargs["reason"] for m in self.marks if m.name == "skip"]


def collect(monkeypatch, *, require_gpu: bool, cuda: bool) -> tuple[Item, Item]:
    """(a gpu_runner test, an unmarked one) through the suite's collection hook."""
    monkeypatch.delenv(conftest.run_order.TIMES_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    config = types.SimpleNamespace(getoption=lambda name: require_gpu if name == "--require-gpu" else None)
    items = [Item(pytest.mark.gpu_runner(reason=REASON)), Item()]
    conftest.pytest_collection_modifyitems(config, items)
    return items[0], items[1]


def test_a_cpu_only_run_skips_it_saying_why_and_where_it_runs(monkeypatch):
    marked, plain = collect(monkeypatch, require_gpu=False, cuda=False)
    (reason,) = marked.skip_reasons()
    assert REASON in reason and "python -m parity.gate --require-gpu" in reason
    assert plain.skip_reasons() == []


@pytest.mark.parametrize("require_gpu, cuda", [(True, False), (False, True)], ids=["require-gpu", "cuda"])
def test_the_gpu_runners_run_it(monkeypatch, require_gpu, cuda):
    marked, _ = collect(monkeypatch, require_gpu=require_gpu, cuda=cuda)
    assert marked.skip_reasons() == []


def test_a_mark_without_a_reason_is_refused():
    with pytest.raises(gpu_runner.MissingReason, match="reason="):
        gpu_runner.skip_reason(pytest.mark.gpu_runner().mark, on_gpu_runner=True)


def test_the_gates_cpu_layers_on_a_gpu_runner_are_given_require_gpu(tmp_path):
    """The gate's CPU step is where these tests run on a GPU runner: it passes --require-gpu (no GPU is
    visible to it) and selects `not gpu`, which keeps them."""
    args = types.SimpleNamespace(require_gpu=True, perf_matrix=False, perf_args="")
    cpu = pytest_commands(args, tmp_path, workers=1, cpu_workers=4, gpu_checks=False)["cpu"]
    assert "--require-gpu" in cpu and cpu[cpu.index("-m", 3) + 1] == "not gpu"
