"""The decoder's folded cross-attention kernels at SAM's real shapes on the GPU, against float64 math.

SAM's decoder widths (256 channels, 8 heads of 16 after the 2x downsampling, 7 tokens: 5 output
tokens and a point with its padding point) over the 64x64 token grid, per-image keys gathered by
image_index (the first layer) and per-prompt keys, for a few prompts and a segment-everything
batch. The error is max |kernel - fp64| relative to max |fp64| of the module path in float64 on the
same rounded inputs and weights. Also: the compiled decoders of the triton stage (SAM 1's, and SAM 2's
for any number of points) launch both kernels without a fallback and keep the module path's masks.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import samfast
from samfast.kernels import (
    fallback_counts,
    image_to_token_attention,
    image_to_token_attention_reference,
    token_to_image_attention,
    token_to_image_attention_reference,
)
from parity.checks.compile import watch
from samfast.kernels.decoder_attention import TOO_MANY_TOKENS
from samfast.modeling.transformer import Attention
from tests.decoder_inputs import decoder_inputs
from tests.kernel_accuracy import relative_error
from tests.sam2_decoder_inputs import sam2_decoder_inputs

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("triton_compiled")]

pytest.importorskip("triton", reason="Triton is not installed")

MAX_RELATIVE = {torch.bfloat16: 2e-2, torch.float16: 3e-3}


def _case(prompts: int, per_image: bool, dtype, seed: int = 0):
    torch.manual_seed(seed)
    attn, norm = Attention(256, 8, downsample_rate=2).cuda(), nn.LayerNorm(256).cuda()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
        norm.bias.normal_(0.0, 0.3)
    images = 2 if per_image else prompts
    keys = torch.randn(images, 64 * 64, 256, device="cuda").to(dtype)
    pe = torch.randn(1, 64 * 64, 256, device="cuda").to(dtype)
    tokens_k = torch.randn(prompts, 7, 256, device="cuda").to(dtype)
    tokens_v = torch.randn(prompts, 7, 256, device="cuda").to(dtype)
    index = torch.arange(prompts, device="cuda") % 2 if per_image else None
    return attn, norm, keys, pe, tokens_k, tokens_v, index


def _fp64(*xs):
    return [x.double() if isinstance(x, torch.Tensor) else copy.deepcopy(x).double() for x in xs]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("prompts, per_image", [(3, True), (3, False), (256, True)], ids=["P3-gathered", "P3", "P256"])
@torch.no_grad()
def test_kernels_match_fp64(dtype, prompts, per_image):
    attn, norm, keys, pe, tokens_k, tokens_v, index = _case(prompts, per_image, dtype)
    low = (copy.deepcopy(attn).to(dtype), copy.deepcopy(norm).to(dtype))
    pooled = token_to_image_attention(low[0], tokens_k, keys, pe, index)
    updated = image_to_token_attention(*low, keys, pe, tokens_k, tokens_v, index)
    assert fallback_counts() == {}, "a kernel did not run"
    attn64, norm64, keys64, pe64, k64, v64 = _fp64(low[0], low[1], keys, pe, tokens_k, tokens_v)
    assert relative_error(pooled, token_to_image_attention_reference(attn64, k64, keys64, pe64, index)) < MAX_RELATIVE[dtype]
    want = image_to_token_attention_reference(attn64, norm64, keys64, pe64, k64, v64, index)
    assert relative_error(updated, want) < MAX_RELATIVE[dtype]


@torch.no_grad()
def test_fp32_takes_the_module_path_visibly():
    attn, norm, keys, pe, tokens_k, tokens_v, index = _case(3, True, torch.float32)
    got = image_to_token_attention(attn, norm, keys, pe, tokens_k, tokens_v, index)
    assert list(fallback_counts()) == ["float32 on the GPU (the kernels are built for 16-bit tensor-core products)"]
    want = image_to_token_attention_reference(attn, norm, keys, pe, tokens_k, tokens_v, index)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@torch.no_grad()
def test_planted_first_image_only_fails_the_bound():
    """Every prompt reading image 0's tokens: the bf16 bound must reject it."""
    attn, norm, keys, pe, tokens_k, tokens_v, index = _case(3, True, torch.bfloat16)
    attn, norm = attn.bfloat16(), norm.bfloat16()
    attn64, norm64, keys64, pe64, k64, v64 = _fp64(attn, norm, keys, pe, tokens_k, tokens_v)
    planted = torch.zeros_like(index)
    pooled = token_to_image_attention(attn, tokens_k, keys, pe, planted)
    updated = image_to_token_attention(attn, norm, keys, pe, tokens_k, tokens_v, planted)
    bound = 5 * MAX_RELATIVE[torch.bfloat16]  # measured on an H100: 0.18 for the pooled keys (means of random keys)
    assert relative_error(pooled, token_to_image_attention_reference(attn64, k64, keys64, pe64, index)) > bound
    assert relative_error(updated, image_to_token_attention_reference(attn64, norm64, keys64, pe64, k64, v64, index)) > bound


@torch.no_grad()
def test_compiled_triton_decoder_runs_the_kernels_and_keeps_the_masks(monkeypatch):
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")
    torch._dynamo.reset()
    model = samfast.build_sam("vit_tiny", device="cuda", stages="triton")
    assert model.mask_decoder.transformer.fused_cross_attention
    inputs = decoder_inputs(model, 40, dtype=torch.bfloat16)
    outputs = {}
    for fused in (False, True):
        model.mask_decoder.transformer.fused_cross_attention = fused
        outputs[fused] = model.mask_decoder(*inputs[:4], True, inputs[4])
    assert fallback_counts() == {}
    assert_same_masks(outputs[True], outputs[False])


def assert_same_masks(fused, module) -> None:
    """(masks, IoUs) of the fused decoder against those of its module path, in bf16."""
    masks, module_masks = fused[0].float(), module[0].float()
    assert ((masks - module_masks).abs().max() / module_masks.abs().max()).item() < 5e-2
    assert ((masks > 0) == (module_masks > 0)).float().mean().item() > 0.99
    torch.testing.assert_close(fused[1].float(), module[1].float(), rtol=5e-2, atol=5e-2)


@torch.no_grad()
def test_compiled_sam2_decoder_runs_the_kernels_for_any_point_count_and_keeps_the_masks(monkeypatch):
    """SAM 2's compiled decoder takes any number of points per prompt: up to 8 (15 tokens) in its graph with
    the kernels padded to their widest (16), more in its module graph (the fallback counted); each graph
    compiled once over 1..16 points, and the kernels' masks the module path's."""
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")
    torch._dynamo.reset()
    model = samfast.build_sam("sam2.1_hiera_t_5block", device="cuda", stages="bf16+compile+sdpa+triton")
    decoder = model.sam_mask_decoder
    with watch() as seen:
        for points in (1, 4, 8, 9, 16):
            embeddings, pe, sparse, dense, high_res, index = sam2_decoder_inputs(
                model, 40, points_per_prompt=points, dtype=torch.bfloat16)
            outputs = {}
            for fused in (False, True):
                decoder.transformer.fused_cross_attention = fused
                outputs[fused] = decoder(embeddings, pe, sparse, dense, True, False, high_res, image_index=index)
            assert_same_masks(outputs[True], outputs[False])
    seen.assert_clean()
    assert seen.graphs_compiled == 2
    assert fallback_counts() == {TOO_MANY_TOKENS: 2}  # 9 and 16 points: the module graph
