"""The decoder's fused upscaling kernel at SAM's real shapes on the GPU, against float64 math.

SAM's widths (256 -> 64 -> 32 channels, 4 masks) over the 64x64 token grid, for a few prompts and
for a segment-everything batch. The error is max |kernel - fp64| relative to max |fp64|; rounding
the inputs and both activations to bf16 puts a correct kernel near 1e-2, a sub-pixel swap near 1.
Also: the compiled decoder of the triton stage launches the kernel without a graph break or a
fallback and gives the gemm path's masks.
"""

from __future__ import annotations

import copy

import pytest
import torch

import samfast
from samfast.kernels import fallback_counts, upscaled_masks, upscaled_masks_reference
from tests.decoder_inputs import decoder_inputs
from tests.kernel_accuracy import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("triton_compiled")]

pytest.importorskip("triton", reason="Triton is not installed")

MAX_RELATIVE = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def _inputs(prompts: int, dtype, seed: int = 0):
    torch.manual_seed(seed)
    upscaling = samfast.build_sam("vit_tiny", device="cuda").mask_decoder.output_upscaling
    with torch.no_grad():
        upscaling[1].weight.normal_(1.0, 0.3)
        upscaling[1].bias.normal_(0.0, 0.3)
    src = torch.randn(prompts, 64 * 64, 256, device="cuda").to(dtype).view(prompts, 64, 64, 256)
    hyper_in = torch.randn(prompts, 4, 32, device="cuda").to(dtype)
    return src, upscaling, hyper_in


def _error_against_fp64(got, src, upscaling, hyper_in) -> float:
    want = upscaled_masks_reference(src.double(), copy.deepcopy(upscaling).double(), hyper_in.double())
    return relative_error(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("prompts", [3, 256], ids=["P3", "P256"])
@torch.no_grad()
def test_kernel_matches_fp64(dtype, prompts):
    src, upscaling, hyper_in = _inputs(prompts, dtype)
    got = upscaled_masks(src, upscaling.to(dtype), hyper_in)
    assert fallback_counts() == {}, "the kernel did not run"
    assert got.shape == (prompts, 4, 256, 256)
    assert _error_against_fp64(got, src, upscaling, hyper_in) < MAX_RELATIVE[dtype]


@torch.no_grad()
def test_planted_sub_pixel_swap_fails_the_bound():
    src, upscaling, hyper_in = _inputs(3, torch.bfloat16)
    planted = copy.deepcopy(upscaling)
    planted[3].weight.copy_(planted[3].weight.transpose(2, 3).clone())
    got = upscaled_masks(src, planted.to(torch.bfloat16), hyper_in)
    assert _error_against_fp64(got, src, upscaling, hyper_in) > 10 * MAX_RELATIVE[torch.bfloat16]


@torch.no_grad()
def test_compiled_triton_decoder_runs_the_kernel_and_matches_gemm(monkeypatch):
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")
    torch._dynamo.reset()
    outputs = {}
    for stages in ("compile", "triton"):
        model = samfast.build_sam("vit_tiny", device="cuda", stages=stages)
        inputs = decoder_inputs(model, 40, dtype=torch.bfloat16)
        outputs[stages] = model.mask_decoder(*inputs[:4], True, inputs[4])
    assert model.mask_decoder.upscale_impl == "triton"
    assert fallback_counts() == {}
    masks, gemm_masks = outputs["triton"][0].float(), outputs["compile"][0].float()
    assert ((masks - gemm_masks).abs().max() / gemm_masks.abs().max()).item() < MAX_RELATIVE[torch.bfloat16]
    agreement = ((masks > 0) == (gemm_masks > 0)).float().mean().item()
    assert agreement > 0.99
