"""Hiera's norm with a channel of ones (kernels.norm_with_bias_channel) against float64 math, on the CPU
through TRITON_INTERPRET=1; and the GEMM that takes the biases from that channel
(samfast.modeling.common.linear_with_bias_channel) against nn.Linear in fp64.

Inputs as Hiera's window-order stream gives them: a contiguous stream of several rows and a deferred
residual bias; widths that add 8, 3 and 1 channels (16, 13, 15), Hiera-L's 144 and 288, and row counts
that leave the last program partly empty. The planted-defect tests feed the kernel subtly wrong inputs
(the residual bias dropped, the norm's weight and bias swapped) or drop what it writes (the ones, the last
row) and require the same tolerance to reject them.
"""

from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from samfast.kernels import fallback_counts, norm_with_bias_channel  # noqa: E402
from samfast.modeling.common import linear_with_bias_channel  # noqa: E402
from tests.kernel_accuracy import node_seed, relative_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreted")

bcn = importlib.import_module("samfast.kernels.bias_channel_norm")


@pytest.fixture(autouse=True)
def several_programs(monkeypatch):
    """Blocks of 16 rows: each test input spans several programs, the last one partly empty."""
    monkeypatch.setattr(bcn, "_INTERPRET_BLOCK_M", 16)


# max |kernel - fp64| relative to max |fp64|: measured at 9.1e-8 to 1.8e-7 (fp32) and 2.4e-4 to 3.5e-4
# (fp16, its rounding of the input and the result); the planted defects at 0.14 and above, so a defect
# must exceed 5x the tolerance
RELATIVE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
PLANTED_FACTOR = 5
EPS = 1e-6

# (leading shape, channels C): a window-order stream (B, nh, nw, w, w) x C, or rows x C
SHAPES = [((2, 2, 2, 3, 3), 16), ((37,), 13), ((45,), 15), ((1, 2, 2, 4, 4), 144), ((33,), 288)]
SHAPE_IDS = ["stream-16", "rows-13", "rows-15", "stream-144", "rows-288"]


def norm_inputs(seed: int, shape, dtype):
    """x with a large mean (a residual stream), the deferred residual bias, the norm's weight and bias."""
    leading, c = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*leading, c, generator=g) * 3 + torch.randn(c, generator=g) * 5 + 2
    residual_bias, weight, bias = (torch.randn(c, generator=g) for _ in range(3))
    return tuple(t.to(dtype) for t in (x, residual_bias, weight, bias))


def error(request, dtype, shape, run=norm_with_bias_channel) -> float:
    inputs = norm_inputs(node_seed(request), shape, dtype)
    got = run(*inputs, EPS)
    c = shape[1]
    assert got.shape == (*inputs[0].shape[:-1], c + bcn.bias_channels(c)) and got.dtype == dtype and got.is_contiguous()
    assert got.shape[-1] % 8 == 0
    return relative_error(got, bcn.norm_with_bias_channel_reference(*(t.double() for t in inputs), EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@torch.no_grad()
def test_norm_with_bias_channel_matches_fp64(request, dtype, shape):
    assert error(request, dtype, shape) < RELATIVE_TOLERANCE[dtype]
    assert fallback_counts() == {}, "the kernel did not run"


def _residual_bias_dropped(run_kernel):
    return lambda x, rb, w, b, eps: run_kernel(x, torch.zeros_like(rb), w, b, eps)


def _norm_affine_swapped(run_kernel):
    return lambda x, rb, w, b, eps: run_kernel(x, rb, b, w, eps)


def _ones_not_written(run_kernel):
    def run(x, rb, w, b, eps):
        out = run_kernel(x, rb, w, b, eps)
        out[..., x.shape[-1]] = 0
        return out
    return run


def _last_row_skipped(run_kernel):
    """Every row but the last, which stays the output's empty memory (zeros here)."""
    def run(x, rb, w, b, eps):
        out = run_kernel(x, rb, w, b, eps).reshape(-1, x.shape[-1] + bcn.bias_channels(x.shape[-1]))
        return torch.cat([out[:-1], torch.zeros_like(out[-1:])]).view(*x.shape[:-1], -1)
    return run


@pytest.mark.parametrize("plant", [_residual_bias_dropped, _norm_affine_swapped, _ones_not_written, _last_row_skipped],
                         ids=["residual-bias-dropped", "norm-affine-swapped", "ones-not-written", "last-row-skipped"])
@pytest.mark.parametrize("shape", SHAPES[:2], ids=SHAPE_IDS[:2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@torch.no_grad()
def test_planted_defects_exceed_the_tolerance(request, monkeypatch, dtype, shape, plant):
    monkeypatch.setattr(bcn, "_run", plant(bcn._run))
    assert error(request, dtype, shape) > PLANTED_FACTOR * RELATIVE_TOLERANCE[dtype]


@torch.no_grad()
def test_bf16_under_the_interpreter_falls_back_with_its_reason():
    inputs = norm_inputs(0, SHAPES[0], torch.bfloat16)
    torch.testing.assert_close(norm_with_bias_channel(*inputs, EPS), bcn.norm_with_bias_channel_reference(*inputs, EPS))
    assert fallback_counts() == {"dtype bfloat16 not supported by the Triton interpreter": 1}


@torch.no_grad()
def test_a_stream_that_is_not_contiguous_goes_to_the_reference_and_is_counted():
    x, residual_bias, weight, bias = norm_inputs(0, ((8,), 16), torch.float32)
    x = x.t().contiguous().t()
    torch.testing.assert_close(norm_with_bias_channel(x, residual_bias, weight, bias, EPS),
                               bcn.norm_with_bias_channel_reference(x, residual_bias, weight, bias, EPS))
    assert fallback_counts() == {"a norm input that is not contiguous": 1}


def test_a_norm_of_another_width_is_refused_with_the_shapes():
    x, residual_bias, weight, bias = norm_inputs(0, SHAPES[1], torch.float32)
    with pytest.raises(ValueError, match=r"\(37, 13\), \(13,\), \(12,\), \(13,\)"):
        norm_with_bias_channel(x, residual_bias, weight[:12], bias, EPS)


@pytest.mark.parametrize("channels", [16, 13, 15, 144])
def test_the_gemm_with_the_bias_as_the_channels_weight_equals_the_linear_in_fp64(channels):
    """On the reference norm's output; the planted defect (the ones written as zeros: the bias silently lost)
    is caught."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(channels, 24).double()
    x = torch.randn(3, 5, channels, dtype=torch.float64)
    zero, one = torch.zeros(channels, dtype=torch.float64), torch.ones(channels, dtype=torch.float64)
    wide = bcn.norm_with_bias_channel_reference(x, zero, one, zero, EPS)
    want = linear(wide[..., :channels])
    torch.testing.assert_close(linear_with_bias_channel(wide, linear), want, rtol=0, atol=1e-12)
    wide[..., channels] = 0
    with pytest.raises(AssertionError):
        torch.testing.assert_close(linear_with_bias_channel(wide, linear), want, rtol=0, atol=1e-6)
