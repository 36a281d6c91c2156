"""The fp8 MLP's GELU + per-row e4m3 quantization kernel against float64 math, on the CPU (TRITON_INTERPRET=1).

Each row's scale must be max |gelu(h)| / 448 and every value gelu(h) / scale rounded to nearest
(tests/fp8_rows.py). The planted-defect tests hand that check the exact GELU instead of the tanh
form, a truncating cast, a scale for the wrong fp8 format, a lost GELU and swapped rows, and
require it to reject each.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="Triton is not installed")

from samfast.kernels import fallback_counts, fp8_linear, gelu_quantize_fp8, gelu_quantize_fp8_reference  # noqa: E402
from samfast.modeling.common import MLPBlock  # noqa: E402
from samfast.quantize import FP8_AMAX_FLOOR  # noqa: E402
from tests.fp8_rows import assert_fp8_rows_quantize_gelu, fp8_row_errors  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("triton_interpreted"),
    # exp(-u) of a very negative x is inf under the interpreter (numpy warns), and x / inf = -0: the GELU's limit
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

fg = importlib.import_module("samfast.kernels.fp8_gelu")


def lin1_output(shape, dtype, seed: int = 0) -> torch.Tensor:
    """Pre-GELU activations of the size lin1 makes (|h| up to ~12), one row all zero (a padded token)."""
    h = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3
    h.view(-1, shape[-1])[1] = 0
    return h.to(dtype)


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((2, 7, 3072), torch.float32),  # vit_b's MLP width, 14 rows: partial tiles
        ((9, 5120), torch.float16),  # vit_h's, not a power of two
        ((3, 5, 200), torch.float32),
    ],
)
def test_kernel_rounds_gelu_to_nearest_e4m3(shape, dtype):
    h = lin1_output(shape, dtype)
    q, scale = gelu_quantize_fp8(h, FP8_AMAX_FLOOR)
    assert fallback_counts() == {}, "the kernel did not run"
    assert_fp8_rows_quantize_gelu(q, scale, h, FP8_AMAX_FLOOR)


def test_all_zero_row_gets_the_floor_scale_and_zeros():
    h = lin1_output((4, 256), torch.float32)
    q, scale = gelu_quantize_fp8(h, FP8_AMAX_FLOOR)
    assert scale[1].item() == pytest.approx(FP8_AMAX_FLOOR / 448)
    assert (q[1].float() == 0).all()
    assert torch.isfinite(q.float()).all()


def test_reference_passes_the_same_check():
    h = lin1_output((6, 3072), torch.float32)
    assert_fp8_rows_quantize_gelu(*gelu_quantize_fp8_reference(h, FP8_AMAX_FLOOR), h, FP8_AMAX_FLOOR)


def _toward_zero(units):
    """Each value's e4m3 neighbour on the zero side (truncation)."""
    nearest = units.float().to(torch.float8_e4m3fn)
    over = nearest.double().abs() > units.abs()
    step_down = (nearest.view(torch.uint8) - 1).view(torch.float8_e4m3fn)  # magnitude one code lower
    return torch.where(over, step_down.float(), nearest.float()).to(torch.float8_e4m3fn)


def _planted(defect, h):
    q, scale = gelu_quantize_fp8_reference(h, FP8_AMAX_FLOOR)
    if defect == "exact GELU instead of the tanh form":
        g = F.gelu(h.float())
        return (g / scale).to(torch.float8_e4m3fn), scale
    if defect == "truncated instead of rounded":
        g = F.gelu(h.double(), approximate="tanh")
        return _toward_zero(g / scale.double()), scale
    if defect == "scale for e4m3fnuz (max 240)":
        g = F.gelu(h.float(), approximate="tanh")
        scale = g.abs().amax(-1, keepdim=True).clamp(min=FP8_AMAX_FLOOR) / 240
        return (g / scale).to(torch.float8_e4m3fn), scale
    if defect == "GELU lost":
        scale = h.float().abs().amax(-1, keepdim=True).clamp(min=FP8_AMAX_FLOOR) / 448
        return (h.float() / scale).to(torch.float8_e4m3fn), scale
    assert defect == "rows swapped"
    return q[[1, 0, *range(2, q.shape[0])]], scale[[1, 0, *range(2, q.shape[0])]]


@pytest.mark.parametrize(
    "defect", ["exact GELU instead of the tanh form", "truncated instead of rounded", "scale for e4m3fnuz (max 240)", "GELU lost", "rows swapped"]
)
def test_planted_defects_fail_the_check(defect):
    h = lin1_output((8, 3072), torch.float32) + 0.5  # no zero row: the swapped rows must differ
    with pytest.raises(AssertionError):
        assert_fp8_rows_quantize_gelu(*_planted(defect, h), h, FP8_AMAX_FLOOR)
    # and the truncation error sits clearly above the bound, not at it
    if defect == "truncated instead of rounded":
        assert fp8_row_errors(*_planted(defect, h), h, FP8_AMAX_FLOOR)[1] > 1.2


def test_cpu_without_the_interpreter_falls_back_and_counts(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    h = lin1_output((3, 256), torch.float32)
    q, scale = gelu_quantize_fp8(h, FP8_AMAX_FLOOR)
    assert fallback_counts() == {"cpu tensors without TRITON_INTERPRET=1": 1}
    assert_fp8_rows_quantize_gelu(q, scale, h, FP8_AMAX_FLOOR)


@pytest.mark.parametrize(
    "h, reason",
    [
        (lin1_output((256, 6), torch.float32).t(), "a non-contiguous input"),
        (lin1_output((2, 2 * fg.MAX_ROW), torch.float32), f"rows wider than {fg.MAX_ROW}"),
    ],
    ids=["strided", "too wide"],
)
def test_inputs_the_kernel_cannot_take_fall_back(h, reason):
    q, scale = gelu_quantize_fp8(h, FP8_AMAX_FLOOR)
    assert fallback_counts() == {reason: 1}
    assert_fp8_rows_quantize_gelu(q, scale, h, FP8_AMAX_FLOOR)


@pytest.mark.parametrize("shape", [(), (4, 0)])
def test_no_rows_is_an_error(shape):
    with pytest.raises(ValueError, match="need rows to quantize"):
        gelu_quantize_fp8(torch.zeros(shape), FP8_AMAX_FLOOR)


def _fp8_weight(linear):
    from torchao.quantization import Float8Tensor, PerRow

    return Float8Tensor.from_hp(linear.weight.detach(), granularity=PerRow())


@torch.no_grad()
def test_fp8_linear_is_the_product_of_the_dequantized_operands():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 64)
    h = lin1_output((2, 5, 256), torch.float32)
    q, scale = gelu_quantize_fp8(h, FP8_AMAX_FLOOR)
    weight = _fp8_weight(linear)
    want = (q.double() * scale.double()) @ (weight.qdata.double() * weight.scale.double()).t() + linear.bias.double()
    got = fp8_linear(q, scale, weight, linear.bias)
    assert got.shape == (2, 5, 64) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_mlp_fp8_kernel_path_is_the_mlp_to_fp8_accuracy():
    """The MLP's "fp8_kernel" path: lin1, the kernel, lin2's scaled product on the e4m3 rows (vit_tiny widths)."""
    torch.manual_seed(0)
    mlp = MLPBlock(128, 512)
    x = torch.randn(3, 10, 128)
    want = mlp.double()(x.double())
    mlp.float()
    for linear in (mlp.lin1, mlp.lin2):  # torchao's rowwise fp8 weights (weight-only on the CPU)
        linear.weight = torch.nn.Parameter(_fp8_weight(linear), requires_grad=False)
    mlp.gelu_impl = "fp8_kernel"
    got = mlp(x)
    assert fallback_counts() == {}, "the kernel did not run"
    relative = ((got.double() - want).norm() / want.norm()).item()
    assert relative < 0.05, relative  # e4m3 rounding of weights and activations: a few percent
    mlp.gelu_impl = "module"  # the planted defect: lin2 fed pre-GELU rows would be far off
    assert ((mlp.lin2(mlp.lin1(x)).double() - want).norm() / want.norm()).item() > 0.3
