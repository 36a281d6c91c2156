"""The compile check must fail on each planted defect and pass a clean compiled module."""

from __future__ import annotations

import logging

import pytest
import torch

from parity.checks.compile import _artifact_loggers, watch


class Block(torch.nn.Module):
    """A small module whose forward can carry one planted defect."""

    def __init__(self, defect: str | None = None) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.defect = defect

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        if self.defect == "graph_break":
            torch._dynamo.graph_break()
        if self.defect == "print":
            print("planted print in forward")
        return torch.nn.functional.gelu(x)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def run(model, *batches, backend="eager", dynamic=None):
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with watch() as seen:
        for b in batches:
            compiled(torch.randn(b, 16))
    return seen


def test_clean_module_same_shape_has_no_breaks_or_recompiles():
    seen = run(Block(), 4, 4, 4, 4)
    seen.assert_clean()
    assert seen.graphs_compiled == 1


@pytest.mark.parametrize(
    "defect, expected", [("graph_break", "graph_break()"), ("print", "print")]
)
def test_planted_graph_break_fails_with_reason_and_user_line(defect, expected):
    seen = run(Block(defect), 4, 4)
    assert len(seen.graph_breaks) == 1  # the same break on the second call is not a new one
    event = seen.graph_breaks[0]
    assert expected in event.reason
    assert event.user_frame and event.user_frame.startswith(__file__)
    with pytest.raises(AssertionError, match="1 graph break") as err:
        seen.assert_clean()
    assert __file__ in str(err.value)


@pytest.mark.parametrize("dynamic", [False, None], ids=["static", "automatic-dynamic"])
def test_unpadded_new_batch_size_recompiles(dynamic):
    # dynamic=False recompiles for every new size; the default (None) recompiles once, as dynamic.
    seen = run(Block(), 1, 2, backend="aot_eager", dynamic=dynamic)
    assert len(seen.recompiles) == 1
    assert "size mismatch" in seen.recompiles[0].reason
    assert seen.recompiles[0].user_frame and __file__ in seen.recompiles[0].user_frame
    with pytest.raises(AssertionError, match="1 recompile"):
        seen.assert_clean()


@pytest.mark.slow
def test_inductor_backend_break_is_caught():
    # The real backend, once: the check must not depend on the eager test backend.
    seen = run(Block("graph_break"), 4, 4, backend="inductor")
    assert len(seen.graph_breaks) == 1 and not seen.recompiles
    assert seen.graphs_compiled == 2  # the frame before the break and its resume function


def test_break_counted_but_not_logged_still_fails():
    # dynamo's counters back up the logs: a break whose log line we never saw is still reported.
    from torch._dynamo.utils import counters

    with watch() as seen:
        counters["graph_break"]["Some future break\n  Explanation: not logged"] += 1
    assert [e.reason for e in seen.graph_breaks] == ["Some future break | Explanation: not logged"]
    with pytest.raises(AssertionError, match="1 graph break"):
        seen.assert_clean()


def test_watch_restores_logging_and_keeps_user_settings():
    from torch._logging._internal import log_state

    loggers = _artifact_loggers("graph_breaks") + _artifact_loggers("recompiles")
    before = [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    log_state.enable_artifact("graph_breaks")  # as if the user ran with TORCH_LOGS=graph_breaks
    try:
        run(Block("graph_break"), 4)
        assert log_state.is_artifact_enabled("graph_breaks")
        assert not log_state.is_artifact_enabled("recompiles")
    finally:
        log_state.artifact_names.discard("graph_breaks")
    assert [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers] == before


def test_quiet_unless_user_asked():
    # Artifact records would otherwise propagate to torch._dynamo's stderr handler.
    class Grab(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    grab = Grab()
    parent = logging.getLogger("torch._dynamo")
    parent.addHandler(grab)
    try:
        run(Block("graph_break"), 4)
    finally:
        parent.removeHandler(grab)
    assert not [m for m in grab.messages if "Graph break" in m]
