"""The quantized MLP's GELU + per-row quantization kernel (e4m3 and int8) against float64 math, on the CPU.

Runs under TRITON_INTERPRET=1. Each row's scale must be max |gelu(h)| / qmax and every value
gelu(h) / scale rounded to nearest (tests/quantized_rows.py). The planted-defect tests hand that
check the exact GELU instead of the tanh form, a truncating cast, a wrong scale, a lost GELU and
swapped rows, and require it to reject each.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="Triton is not installed")

from samfast.kernels import fallback_counts, gelu_quantize, gelu_quantize_reference, quantized_linear  # noqa: E402
from samfast.modeling.common import MLPBlock  # noqa: E402
from samfast.quantize import ACTIVATION_AMAX_FLOOR as FLOOR  # noqa: E402
from tests.quantized_rows import QMAX, assert_rows_quantize_gelu, row_errors  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("triton_interpreted"),
    # exp(-u) of a very negative x is inf under the interpreter (numpy warns), and x / inf = -0: the GELU's limit
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

gq = importlib.import_module("samfast.kernels.gelu_quantize")
E4M3, INT8 = torch.float8_e4m3fn, torch.int8
DTYPES = pytest.mark.parametrize("qdtype", [E4M3, INT8], ids=["e4m3", "int8"])


def lin1_output(shape, dtype, seed: int = 0) -> torch.Tensor:
    """Pre-GELU activations of the size lin1 makes (|h| up to ~12), one row all zero (a padded token)."""
    h = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3
    h.view(-1, shape[-1])[1] = 0
    return h.to(dtype)


@DTYPES
@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((2, 7, 3072), torch.float32),  # vit_b's MLP width, 14 rows: partial tiles
        ((9, 5120), torch.float16),  # vit_h's, not a power of two
        ((3, 5, 200), torch.float32),
    ],
)
def test_kernel_rounds_gelu_to_nearest(qdtype, shape, dtype):
    h = lin1_output(shape, dtype)
    q, scale = gelu_quantize(h, qdtype, FLOOR)
    assert fallback_counts() == {}, "the kernel did not run"
    assert_rows_quantize_gelu(q, scale, h, FLOOR)


@DTYPES
def test_all_zero_row_gets_the_floor_scale_and_zeros(qdtype):
    h = lin1_output((4, 256), torch.float32)
    q, scale = gelu_quantize(h, qdtype, FLOOR)
    assert scale[1].item() == pytest.approx(FLOOR / QMAX[qdtype])
    assert (q[1].float() == 0).all()
    assert torch.isfinite(q.float()).all()


def test_int8_uses_the_whole_range_and_no_more():
    """+-127.5 x scale is the row's amax: the largest value rounds to 128 and is clamped to 127, its negative to -128."""
    h = torch.tensor([[4.0, -1.0, 0.5], [-4.0, 1.0, 0.5]]) * 10  # gelu(-40) = -0: row 2's amax is 10
    q, _ = gelu_quantize(h, INT8, FLOOR)
    assert q[0, 0].item() == 127 and q[1, 1].item() == 127


@DTYPES
def test_reference_passes_the_same_check(qdtype):
    h = lin1_output((6, 3072), torch.float32)
    assert_rows_quantize_gelu(*gelu_quantize_reference(h, qdtype, FLOOR), h, FLOOR)


def _toward_zero(units, qdtype):
    """Each value's grid neighbour on the zero side (truncation)."""
    if qdtype == INT8:
        return units.trunc().clamp(-128, 127).to(INT8)
    nearest = units.float().to(E4M3)
    over = nearest.double().abs() > units.abs()
    step_down = (nearest.view(torch.uint8) - 1).view(E4M3)  # magnitude one code lower
    return torch.where(over, step_down.float(), nearest.float()).to(E4M3)


def _planted(defect, h, qdtype):
    q, scale = gelu_quantize_reference(h, qdtype, FLOOR)
    tanh = F.gelu(h.double(), approximate="tanh")
    if defect == "exact GELU instead of the tanh form":
        return _nearest(F.gelu(h.double()) / scale.double(), qdtype), scale
    if defect == "truncated instead of rounded":
        return _toward_zero(tanh / scale.double(), qdtype), scale
    if defect == "scale 15% small":
        small = scale * 0.85
        return _nearest(tanh / small.double(), qdtype), small
    if defect == "GELU lost":
        return _nearest(h.double() / scale.double(), qdtype), scale
    assert defect == "rows swapped"
    swap = [1, 0, *range(2, q.shape[0])]
    return q[swap], scale[swap]


def _nearest(units, qdtype):
    if qdtype == INT8:
        return units.round().clamp(-128, 127).to(INT8)
    return units.clamp(-448, 448).float().to(E4M3)


DEFECTS = ["truncated instead of rounded", "scale 15% small", "GELU lost", "rows swapped"]


# The exact GELU is at most 4.7e-4 from the tanh form: visible on e4m3's fine grid near zero, a
# hundredth of an int8 step (so not a defect there).
@pytest.mark.parametrize(
    "qdtype, defect",
    [(E4M3, "exact GELU instead of the tanh form")] + [(q, d) for q in (E4M3, INT8) for d in DEFECTS],
)
def test_planted_defects_fail_the_check(qdtype, defect):
    h = lin1_output((8, 3072), torch.float32) + 0.5  # no zero row: the swapped rows must differ
    with pytest.raises(AssertionError):
        assert_rows_quantize_gelu(*_planted(defect, h, qdtype), h, FLOOR)
    # and the value errors sit clearly above the bound, not at it
    if defect in ("exact GELU instead of the tanh form", "truncated instead of rounded"):
        assert row_errors(*_planted(defect, h, qdtype), h, FLOOR)[1] > 1.2


def test_cpu_without_the_interpreter_falls_back_and_counts(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    h = lin1_output((3, 256), torch.float32)
    q, scale = gelu_quantize(h, E4M3, FLOOR)
    assert fallback_counts() == {"cpu tensors without TRITON_INTERPRET=1": 1}
    assert_rows_quantize_gelu(q, scale, h, FLOOR)


@pytest.mark.parametrize(
    "h, reason",
    [
        (lin1_output((256, 6), torch.float32).t(), "a non-contiguous input"),
        (lin1_output((2, 2 * gq.MAX_ROW), torch.float32), f"rows wider than {gq.MAX_ROW}"),
    ],
    ids=["strided", "too wide"],
)
def test_inputs_the_kernel_cannot_take_fall_back(h, reason):
    q, scale = gelu_quantize(h, INT8, FLOOR)
    assert fallback_counts() == {reason: 1}
    assert_rows_quantize_gelu(q, scale, h, FLOOR)


@pytest.mark.parametrize(
    "shape, dtype, match",
    [((), E4M3, "need rows to quantize"), ((4, 0), INT8, "need rows to quantize"), ((4, 8), torch.float16, "quantizes to")],
)
def test_bad_arguments_are_errors(shape, dtype, match):
    with pytest.raises(ValueError, match=match):
        gelu_quantize(torch.zeros(shape), dtype, FLOOR)


def _quantized_weight(linear, qdtype):
    from torchao.quantization import Float8Tensor, Int8Tensor, PerRow

    kind = Float8Tensor if qdtype == E4M3 else Int8Tensor
    return kind.from_hp(linear.weight.detach(), granularity=PerRow())


@DTYPES
@torch.no_grad()
def test_quantized_linear_is_the_product_of_the_dequantized_operands(qdtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 64)
    h = lin1_output((2, 5, 256), torch.float32)
    q, scale = gelu_quantize(h, qdtype, FLOOR)
    weight = _quantized_weight(linear, qdtype)
    w = weight.qdata.double() * weight.scale.double().reshape(-1, 1)
    want = (q.double() * scale.double()) @ w.t() + linear.bias.double()
    got = quantized_linear(q, scale, weight, linear.bias)
    assert got.shape == (2, 5, 64) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@DTYPES
@torch.no_grad()
def test_mlp_quantized_kernel_path_is_the_mlp_to_quantized_accuracy(qdtype):
    """The MLP's "quantized_kernel" path: lin1, the kernel, lin2's product on the quantized rows (vit_tiny widths)."""
    torch.manual_seed(0)
    mlp = MLPBlock(128, 512)
    x = torch.randn(3, 10, 128)
    want = mlp.double()(x.double())
    mlp.float()
    for linear in (mlp.lin1, mlp.lin2):  # torchao's rowwise weights (weight-only for lin1 here)
        linear.weight = torch.nn.Parameter(_quantized_weight(linear, qdtype), requires_grad=False)
    mlp.gelu_impl = "quantized_kernel"
    got = mlp(x)
    assert fallback_counts() == {}, "the kernel did not run"
    relative = ((got.double() - want).norm() / want.norm()).item()
    assert relative < 0.05, relative  # rounding of weights and activations: a few percent at most
    mlp.gelu_impl = "module"  # the planted defect: lin2 fed pre-GELU rows would be far off
    assert ((mlp.lin2(mlp.lin1(x)).double() - want).norm() / want.norm()).item() > 0.3
