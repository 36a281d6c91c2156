"""The fp8 MLP's GELU + e4m3 quantization kernel at SAM's real widths on the GPU, and in the fp8 stage.

The kernel's rows are held to tests/fp8_rows.py's check (scales, rounding to nearest) in bf16 at
vit_b's and vit_h's MLP widths. The fp8 stage (lossless stack + fp8, triton switch included) must
route every MLP through the kernel, compiled, without a fallback, and give the encoder output of
torchao's own path (GELU, then lin2's quantization) to the fp8 rounding.
"""

from __future__ import annotations

import pytest
import torch

import samfast
from samfast.kernels import fallback_counts, gelu_quantize_fp8
from samfast.quantize import FP8_AMAX_FLOOR
from tests.fp8_rows import assert_fp8_rows_quantize_gelu

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("triton_compiled")]

pytest.importorskip("triton", reason="Triton is not installed")


def _needs_fp8():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")


@pytest.mark.parametrize("rows, width", [(4096, 3072), (1000, 5120), (7, 512)], ids=["vit_b", "vit_h", "vit_tiny"])
def test_kernel_rounds_gelu_to_nearest_e4m3(rows, width):
    h = torch.randn(rows, width, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 3
    h[1] = 0  # a padded token
    h = h.bfloat16()
    q, scale = gelu_quantize_fp8(h, FP8_AMAX_FLOOR)
    assert fallback_counts() == {}, "the kernel did not run"
    assert_fp8_rows_quantize_gelu(q, scale, h, FP8_AMAX_FLOOR)


@torch.no_grad()
def test_fp8_stage_runs_the_kernel_compiled_and_keeps_the_encoder_output(monkeypatch):
    _needs_fp8()
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")  # the kernel, not autotuning, is under test
    model = samfast.build_sam("vit_tiny", device="cuda", stages="fp8")
    assert {block.mlp.gelu_impl for block in model.image_encoder.blocks} == {"fp8_kernel"}
    images = torch.randn(2, 3, 1024, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    fused = model.image_encoder(images.bfloat16()).double()
    assert fallback_counts() == {}, "a kernel fell back in the compiled fp8 encoder"
    for block in model.image_encoder.blocks:  # torchao's own path: GELU, then lin2 quantizes
        block.mlp.gelu_impl = "module"
    torchao_path = model.image_encoder(images.bfloat16()).double()
    relative = ((fused - torchao_path).norm() / torchao_path.norm()).item()
    assert relative < 0.05, f"the fused fp8 MLP moves the encoder output by {relative:.4f} (relative L2)"
