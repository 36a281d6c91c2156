"""dispatch.loop_bound: a kernel's runtime loop bound reaches the interpreter's range() as a constexpr, which
every Triton's interpreter leaves as it is (Triton 3.6's turns an int argument into a one-element array that
range() cannot take under numpy >= 2.4), and the compiled kernel as the plain int it specializes on."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="Triton is not installed")

from samfast.kernels.dispatch import loop_bound, tl  # noqa: E402


def test_under_the_interpreter_a_loop_bound_is_a_constexpr_that_range_takes(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    bound = loop_bound(7)
    assert isinstance(bound, tl.constexpr)
    assert range(0, bound) == range(7)


def test_compiled_a_loop_bound_is_the_int_itself(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    bound = loop_bound(7)
    assert type(bound) is int and bound == 7
