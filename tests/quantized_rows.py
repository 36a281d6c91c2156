"""Checking per-row quantizations of gelu(h) (e4m3 or int8) against float64 math (kernels.gelu_quantize).

A correct quantization has, per row, scale = max |gelu(h)| / qmax (floored; qmax 448 for e4m3,
127.5 for int8) and each value within half a grid step of gelu(h) / scale: rounding to nearest
(gelu: the tanh form; the e4m3 grid step is 2^(e - 3) for a value of exponent e, 2^-9 below 2^-6;
int8's is 1). The bound adds 1% of the value: fp32 GELUs lose relative accuracy where the result
is tiny (PyTorch's CPU GELU computes 0.5 x (1 + tanh(...)), which cancels for x < -3), which can
carry a value just past a rounding midpoint. Truncating instead of rounding errs by up to a whole
step (two halves), the exact GELU instead of the tanh form, a wrong scale or a lost GELU by more.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

QMAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.5}
SCALE_RTOL = 1e-5
VALUE_SLACK = 0.01


def row_errors(q: torch.Tensor, scale: torch.Tensor, h: torch.Tensor, amax_floor: float) -> tuple[float, float]:
    """(worst relative error of the scales, worst |q - gelu(h) / scale| over its bound: <= 1 is rounded to nearest)."""
    g = F.gelu(h.double(), approximate="tanh")
    want_scale = g.abs().amax(-1, keepdim=True).clamp(min=amax_floor) / QMAX[q.dtype]
    scale_err = ((scale.double() - want_scale).abs() / want_scale).max().item()
    units = g / scale.double()
    if q.dtype == torch.int8:
        units, half_step = units.clamp(-128, 127), 0.5
    else:
        units = units.clamp(-QMAX[q.dtype], QMAX[q.dtype])
        exponent = torch.floor(torch.log2(units.abs().clamp(min=2.0**-6)))  # below 2^-6: the subnormal grid
        half_step = 0.5 * torch.exp2(exponent - 3)
    return scale_err, ((q.double() - units).abs() / (half_step + VALUE_SLACK * units.abs())).max().item()


def assert_rows_quantize_gelu(q, scale, h, amax_floor: float) -> None:
    assert q.dtype in QMAX and q.shape == h.shape, (q.dtype, q.shape, h.shape)
    assert scale.dtype == torch.float32 and scale.shape == (*h.shape[:-1], 1), (scale.dtype, scale.shape)
    scale_err, value_err = row_errors(q, scale, h, amax_floor)
    assert scale_err < SCALE_RTOL, f"row scales off by {scale_err:.2e} (relative)"
    assert value_err <= 1, f"a value is {value_err:.3f}x its bound from gelu(h) / scale: not rounded to nearest"
