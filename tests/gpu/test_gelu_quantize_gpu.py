"""The quantized MLP's GELU + quantization kernel at SAM's real widths on the GPU, and in the quantized stages.

The kernel's rows are held to tests/quantized_rows.py's check (scales, rounding to nearest) in bf16
at vit_b's and vit_h's MLP widths, to e4m3 and to int8. The fp8 and int8 stages (the triton switch
included) must route every MLP through the kernel, compiled, without a fallback, and give the
encoder output of torchao's own path (GELU, then lin2's quantization) to the quantization's rounding.
"""

from __future__ import annotations

import pytest
import torch

import samfast
from samfast.kernels import fallback_counts, gelu_quantize
from samfast.quantize import ACTIVATION_AMAX_FLOOR as FLOOR
from tests.quantized_rows import assert_rows_quantize_gelu

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("triton_compiled")]

pytest.importorskip("triton", reason="Triton is not installed")


@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8], ids=["e4m3", "int8"])
@pytest.mark.parametrize("rows, width", [(4096, 3072), (1000, 5120), (7, 512)], ids=["vit_b", "vit_h", "vit_tiny"])
def test_kernel_rounds_gelu_to_nearest(qdtype, rows, width):
    h = torch.randn(rows, width, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 3
    h[1] = 0  # a padded token
    h = h.bfloat16()
    q, scale = gelu_quantize(h, qdtype, FLOOR)
    assert fallback_counts() == {}, "the kernel did not run"
    assert_rows_quantize_gelu(q, scale, h, FLOOR)


@pytest.mark.parametrize("stages", ["fp8", "int8"])
@torch.no_grad()
def test_quantized_stage_runs_the_kernel_compiled_and_keeps_the_encoder_output(monkeypatch, stages):
    if stages == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")  # the kernel, not autotuning, is under test
    model = samfast.build_sam("vit_tiny", device="cuda", stages=stages)
    assert {block.mlp.gelu_impl for block in model.image_encoder.blocks} == {"quantized_kernel"}
    images = torch.randn(2, 3, 1024, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    fused = model.image_encoder(images.bfloat16()).double()
    assert fallback_counts() == {}, "a kernel fell back in the compiled encoder"
    for block in model.image_encoder.blocks:  # torchao's own path: GELU, then lin2 quantizes
        block.mlp.gelu_impl = "module"
    torchao_path = model.image_encoder(images.bfloat16()).double()
    relative = ((fused - torchao_path).norm() / torchao_path.norm()).item()
    assert relative < 0.05, f"the fused quantized MLP moves the encoder output by {relative:.4f} (relative L2)"
