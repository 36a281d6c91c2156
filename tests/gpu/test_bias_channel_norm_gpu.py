"""Hiera's norm with a channel of ones (kernels.norm_with_bias_channel) on the GPU at Hiera-L's shapes at batch
8 (the first stage's 524288 x 144 stream, the second's 131072 x 288), against float64 math, and the GEMM that
takes the biases from it against F.linear. Compiled inside the window-order stream it is held by
tests/gpu/test_hiera_window_order_gpu.py (tests/gpu/test_sam2_gpu.py builds hiera_t, whose padded windows
never take that path)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from samfast.kernels import fallback_counts, norm_with_bias_channel, norm_with_bias_channel_reference
from samfast.modeling.common import linear_with_bias_channel
from tests.kernel_accuracy import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("triton_compiled")]

pytest.importorskip("triton", reason="Triton is not installed")

# max |kernel - fp64 on the same rounded inputs| relative to max |fp64|: the kernel rounds once, at its output
MAX_RELATIVE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("rows, channels", [(524288, 144), (131072, 288)], ids=["stage-1", "stage-2"])
@torch.no_grad()
def test_the_norm_matches_fp64_at_hiera_ls_shapes(dtype, rows, channels):
    torch.manual_seed(0)
    x = (torch.randn(rows, channels, device="cuda") * 3 + 2).to(dtype)
    residual_bias, weight, bias = (torch.randn(channels, device="cuda").to(dtype) for _ in range(3))
    got = norm_with_bias_channel(x, residual_bias, weight, bias, 1e-6)
    assert fallback_counts() == {}, "the kernel did not run"
    want = norm_with_bias_channel_reference(*(t.double() for t in (x, residual_bias, weight, bias)), 1e-6)
    assert relative_error(got, want) < MAX_RELATIVE[dtype]


@torch.no_grad()
def test_the_gemm_with_the_bias_channel_equals_f_linear_in_bf16():
    """Both accumulate in fp32 and round once: within a bf16 rounding of each other."""
    torch.manual_seed(0)
    x = torch.randn(8192, 144, device="cuda").bfloat16()
    linear = torch.nn.Linear(144, 432, device="cuda").bfloat16()
    wide = torch.cat([x, torch.ones_like(x[:, :1]), torch.zeros_like(x[:, :7])], dim=1)
    want = F.linear(x, linear.weight, linear.bias)
    assert relative_error(linear_with_bias_channel(wide, linear), want) < 1e-2
