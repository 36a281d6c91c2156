"""Checking per-row e4m3 quantizations of gelu(h) against float64 math (kernels.gelu_quantize_fp8).

A correct quantization has, per row, scale = max |gelu(h)| / 448 (floored) and each e4m3 value
within half a grid step of gelu(h) / scale: rounding to nearest (gelu: the tanh form). The bound
adds 1% of the value: fp32 GELUs lose relative accuracy for x < -3 (PyTorch's CPU erf GELU is
off by 0.3% at x = -3.95), which can carry a value just past a rounding midpoint. Truncating
instead of rounding errs by up to a whole step (a 1% slack is at most a third of a half-step);
the exact GELU instead of the tanh form, a wrong scale or a lost GELU by far more.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_MAX = 448.0
SCALE_RTOL = 1e-5
VALUE_SLACK = 0.01


def fp8_row_errors(q: torch.Tensor, scale: torch.Tensor, h: torch.Tensor, amax_floor: float) -> tuple[float, float]:
    """(worst relative error of the scales, worst |q - gelu(h) / scale| over its bound: <= 1 is rounded to nearest)."""
    g = F.gelu(h.double(), approximate="tanh")
    want_scale = g.abs().amax(-1, keepdim=True).clamp(min=amax_floor) / FP8_MAX
    scale_err = ((scale.double() - want_scale).abs() / want_scale).max().item()
    units = (g / scale.double()).clamp(-FP8_MAX, FP8_MAX)
    exponent = torch.floor(torch.log2(units.abs().clamp(min=2.0**-6)))  # below 2^-6: the subnormal grid
    half_step = 0.5 * torch.exp2(exponent - 3)
    return scale_err, ((q.double() - units).abs() / (half_step + VALUE_SLACK * units.abs())).max().item()


def assert_fp8_rows_quantize_gelu(q, scale, h, amax_floor: float) -> None:
    assert q.dtype == torch.float8_e4m3fn and q.shape == h.shape, (q.dtype, q.shape, h.shape)
    assert scale.dtype == torch.float32 and scale.shape == (*h.shape[:-1], 1), (scale.dtype, scale.shape)
    scale_err, step_err = fp8_row_errors(q, scale, h, amax_floor)
    assert scale_err < SCALE_RTOL, f"row scales off by {scale_err:.2e} (relative)"
    assert step_err <= 1, f"a value is {step_err:.3f}x its bound from gelu(h) / scale: not rounded to nearest"
