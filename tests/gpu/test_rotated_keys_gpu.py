"""The memory keys' projection-and-rotation kernel on the GPU, at hiera_l's tracking shapes, against float64
math. Compiled inside the tracker it is held by tests/gpu/test_video_gpu.py: the triton stages (one
object's static graph and the objects' dynamic one) against the fp32 golden, with the switch's proof
that no call fell back."""

from __future__ import annotations

import pytest
import torch

from samfast.kernels import fallback_counts, rotated_keys
from samfast.modeling.rope import axial_rotations, rotated_keys_reference
from tests.kernel_accuracy import relative_error
from tests.unit.test_rotated_keys_kernel import fp64_keys

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("triton_compiled")]

pytest.importorskip("triton", reason="Triton is not installed")

# max |kernel - fp64| relative to max |fp64|; the module path's own error on the same inputs beside it
MAX_RELATIVE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-3}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("objects", [1, 8])
@torch.no_grad()
def test_rotated_keys_match_fp64_at_hiera_l_shapes(dtype, objects):
    """7 memory frames of the 64 x 64 map, mem_dim 64 -> 256 channels, the memory a (B, tokens, 64) view
    of the tracker's sequence-first one."""
    torch.manual_seed(0)
    memory = torch.randn(7 * 4096, objects, 64, device="cuda").to(dtype).transpose(0, 1)
    weight = (torch.randn(256, 64, device="cuda") / 8).to(dtype)
    bias = torch.randn(256, device="cuda").to(dtype)
    inputs = memory, weight, bias, axial_rotations(256, 64, 64).cuda()
    want = fp64_keys(*inputs)
    got = rotated_keys(*inputs, reference=rotated_keys_reference)
    assert fallback_counts() == {}, "the kernel did not run"
    err = relative_error(got, want)
    module_err = relative_error(rotated_keys_reference(*inputs), want)
    assert err < MAX_RELATIVE[dtype], f"kernel {err:.2e}, module path {module_err:.2e}"
