"""The decoder's folded cross-attention kernels against float64 math, on the CPU through TRITON_INTERPRET=1.

The reference is the module path itself (the decoder's Attention with its projections, the
residual and layer norm) run in float64 on the same weights, so these tests check the folding
algebra as well as the kernels. The planted-defect tests feed the kernels subtly wrong inputs (the
positional encoding dropped, every prompt reading image 0, the softmax over all heads at once,
padded tokens left in the softmax) and require the same tolerance to reject them.
"""

from __future__ import annotations

import copy
import functools
import importlib
import logging

import pytest
import torch
from torch import nn

pytest.importorskip("triton", reason="Triton is not installed")

import samfast  # noqa: E402
from samfast.kernels import (  # noqa: E402
    fallback_counts,
    image_to_token_attention,
    image_to_token_attention_reference,
    token_to_image_attention,
    token_to_image_attention_reference,
)
from samfast.modeling.transformer import Attention  # noqa: E402
from samfast.modeling.sam2_prompting.mask_decoder import MIN_FUSED_PROMPTS  # noqa: E402
from tests.decoder_inputs import decoder_inputs  # noqa: E402
from tests.kernel_accuracy import node_seed, relative_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreted")

da = importlib.import_module("samfast.kernels.decoder_attention")

# max |kernel - fp64| relative to max |fp64|: fp32 (IEEE products) sits at 1e-7 to 5e-7, fp16 at
# 3e-4 to 7e-4; the planted defects at 3.5e-2 and above (after the layer norm, the attention's share
# of the output is diluted by the residual), so a defect must exceed 5x the tolerance
RELATIVE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3}
PLANTED_FACTOR = 5

# (C, heads, image tokens L, tokens T, images, image_index): SAM's widths first
SHAPES = [
    (256, 8, 45, 7, 2, [0, 1, 1]),  # per-image keys gathered by image_index; L over 2 blocks of 32
    (256, 8, 20, 7, 3, None),  # per-prompt keys, one partial block
    (64, 4, 37, 3, 2, [1, 0]),  # 3 tokens padded to 4 per head
    (32, 2, 33, 5, 1, [0, 0, 0]),  # 2 heads: tokens padded to 8 so that heads x tokens >= 16
    (64, 8, 40, 16, 2, None),  # 8 heads x 16 tokens: the widest the kernels take
]
SHAPE_IDS = ["sam-gathered", "sam-per-prompt", "4-heads", "2-heads", "128-columns"]


def make_modules(seed: int, c: int, heads: int) -> tuple[nn.Module, nn.LayerNorm]:
    """The decoder's cross attention (width halved inside, as in SAM) and a layer norm with random parameters."""
    torch.manual_seed(seed)
    attn, norm = Attention(c, heads, downsample_rate=2), nn.LayerNorm(c)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
        norm.bias.normal_(0.0, 0.3)
    return attn, norm


def make_inputs(seed: int, c: int, length: int, tokens: int, images: int, image_index, dtype):
    g = torch.Generator().manual_seed(seed)
    prompts = images if image_index is None else len(image_index)
    keys = torch.randn(images, length, c, generator=g).to(dtype)
    pe = torch.randn(1, length, c, generator=g).to(dtype)
    tokens_k = torch.randn(prompts, tokens, c, generator=g).to(dtype)
    tokens_v = torch.randn(prompts, tokens, c, generator=g).to(dtype)
    index = None if image_index is None else torch.tensor(image_index)
    return keys, pe, tokens_k, tokens_v, index


def fp64(*modules_or_tensors):
    return [x.double() if isinstance(x, torch.Tensor) else copy.deepcopy(x).double() for x in modules_or_tensors]


def token_to_image_error(request, dtype, shape, run=token_to_image_attention) -> float:
    c, heads, length, tokens, images, image_index = shape
    attn, _ = make_modules(node_seed(request), c, heads)
    keys, pe, queries, _, index = make_inputs(node_seed(request), c, length, tokens, images, image_index, dtype)
    got = run(copy.deepcopy(attn).to(dtype), queries, keys, pe, index)
    assert got.shape == (queries.shape[0], tokens, c) and got.dtype == dtype
    return relative_error(got, token_to_image_attention_reference(*fp64(attn, queries, keys, pe), index))


def image_to_token_error(request, dtype, shape, run=image_to_token_attention) -> float:
    c, heads, length, tokens, images, image_index = shape
    attn, norm = make_modules(node_seed(request), c, heads)
    keys, pe, tokens_k, tokens_v, index = make_inputs(node_seed(request), c, length, tokens, images, image_index, dtype)
    got = run(copy.deepcopy(attn).to(dtype), copy.deepcopy(norm).to(dtype), keys, pe, tokens_k, tokens_v, index)
    assert got.shape == (tokens_k.shape[0], length, c) and got.dtype == dtype
    want = image_to_token_attention_reference(*fp64(attn, norm, keys, pe, tokens_k, tokens_v), index)
    return relative_error(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@torch.no_grad()
def test_token_to_image_matches_fp64(request, dtype, shape):
    assert token_to_image_error(request, dtype, shape) < RELATIVE_TOLERANCE[dtype]
    assert fallback_counts() == {}, "the kernel did not run"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@torch.no_grad()
def test_image_to_token_matches_fp64(request, dtype, shape):
    assert image_to_token_error(request, dtype, shape) < RELATIVE_TOLERANCE[dtype]
    assert fallback_counts() == {}, "the kernel did not run"


def _pe_dropped(run_kernel):
    return lambda keys, pe, *rest: run_kernel(keys, torch.zeros_like(pe), *rest)


def _first_image_only(run_kernel):
    return lambda keys, pe, *rest: run_kernel(keys, pe, *rest[:-1], torch.zeros_like(rest[-1]))


def _first_image_only_update(run_kernel):
    # image_to_token_update's index sits before t_pad and eps
    return lambda *args: run_kernel(*args[:8], torch.zeros_like(args[8]), *args[9:])


def _softmax_over_all_heads(run_kernel):
    return lambda *args: run_kernel(*args[:9], args[2].shape[2], args[10])


def _padding_in_softmax(run_kernel):
    return lambda keys, pe, a, a_bias, *rest: run_kernel(keys, pe, a, a_bias.nan_to_num(neginf=0.0), *rest)


SHAPE_WITH_GATHER_AND_PADDING = SHAPES[2]  # 2 images, 3 tokens padded to 4 per head


@pytest.mark.parametrize("plant", [_pe_dropped, _first_image_only], ids=["pe-dropped", "first-image-only"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@torch.no_grad()
def test_planted_token_to_image_defect_is_caught(request, monkeypatch, plant, dtype):
    monkeypatch.setattr(da, "_run_token_to_image", plant(da._run_token_to_image))
    error = token_to_image_error(request, dtype, SHAPE_WITH_GATHER_AND_PADDING)
    assert fallback_counts() == {}
    assert error > PLANTED_FACTOR * RELATIVE_TOLERANCE[dtype]


@pytest.mark.parametrize(
    "plant",
    [_pe_dropped, _first_image_only_update, _softmax_over_all_heads, _padding_in_softmax],
    ids=["pe-dropped", "first-image-only", "softmax-over-all-heads", "padding-in-softmax"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@torch.no_grad()
def test_planted_image_to_token_defect_is_caught(request, monkeypatch, plant, dtype):
    monkeypatch.setattr(da, "_run_image_to_token", plant(da._run_image_to_token))
    error = image_to_token_error(request, dtype, SHAPE_WITH_GATHER_AND_PADDING)
    assert fallback_counts() == {}
    assert error > PLANTED_FACTOR * RELATIVE_TOLERANCE[dtype]


@torch.no_grad()
def test_cpu_without_interpreter_falls_back_visibly(request, monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET")
    attn, norm = make_modules(node_seed(request), 64, 4)
    keys, pe, tokens_k, tokens_v, index = make_inputs(node_seed(request), 64, 10, 3, 2, [1, 0, 1], torch.float32)
    with caplog.at_level(logging.WARNING, logger="samfast.kernels"):
        pooled = token_to_image_attention(attn, tokens_k, keys, pe, index)
        updated = image_to_token_attention(attn, norm, keys, pe, tokens_k, tokens_v, index)
    assert fallback_counts() == {"cpu tensors without TRITON_INTERPRET=1": 2}
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "token_to_image_attention" in logged and "image_to_token_attention" in logged
    want = token_to_image_attention_reference(attn, tokens_k, keys, pe, index)
    torch.testing.assert_close(pooled, want, rtol=0, atol=0)
    want = image_to_token_attention_reference(attn, norm, keys, pe, tokens_k, tokens_v, index)
    torch.testing.assert_close(updated, want, rtol=0, atol=0)


@torch.no_grad()
def test_more_tokens_than_the_kernels_hold_fall_back(request):
    attn, norm = make_modules(node_seed(request), 64, 8)
    keys, pe, tokens_k, tokens_v, _ = make_inputs(node_seed(request), 64, 10, 17, 2, None, torch.float32)
    token_to_image_attention(attn, tokens_k, keys, pe)
    image_to_token_attention(attn, norm, keys, pe, tokens_k, tokens_v)
    (reason,) = fallback_counts()
    assert "heads x padded tokens above 128" in reason and fallback_counts()[reason] == 2


@torch.no_grad()
def test_other_norms_fall_back(request):
    attn, _ = make_modules(node_seed(request), 64, 4)
    keys, pe, tokens_k, tokens_v, index = make_inputs(node_seed(request), 64, 10, 3, 2, [1, 0, 1], torch.float32)
    norm = nn.LayerNorm(64, elementwise_affine=False)
    got = image_to_token_attention(attn, norm, keys, pe, tokens_k, tokens_v, index)
    assert fallback_counts() == {"a norm other than an affine nn.LayerNorm": 1}
    want = image_to_token_attention_reference(attn, norm, keys, pe, tokens_k, tokens_v, index)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@torch.no_grad()
def test_mismatched_shapes_are_refused_with_the_expected_ones(request):
    attn, norm = make_modules(node_seed(request), 64, 4)
    keys, pe, tokens_k, tokens_v, index = make_inputs(node_seed(request), 64, 10, 3, 2, [1, 0, 1], torch.float32)
    with pytest.raises(ValueError, match=r"3 prompts of tokens but 2 of keys"):
        token_to_image_attention(attn, tokens_k, keys, pe)
    with pytest.raises(ValueError, match=r"pe \(1, L, C\)"):
        image_to_token_attention(attn, norm, keys, pe[:, :5], tokens_k, tokens_v, index)


@pytest.mark.parametrize("mask_inputs", [False, True], ids=["shared-image", "mask-input-per-prompt"])
@torch.no_grad()
def test_decoder_with_the_kernels_equals_the_module_path(monkeypatch, mask_inputs):
    """vit_tiny's decoder at its trained shape (64x64 tokens, 256 channels) end to end, fp32:
    the first layer's per-image keys (gathered) and, with a mask input per prompt, per-prompt keys."""
    monkeypatch.setattr(da, "_INTERPRET_BLOCK_L", 512)  # fewer interpreted steps: same arithmetic
    model = samfast.build_sam("vit_tiny", device="cpu")
    inputs = decoder_inputs(model, 3, mask_inputs=mask_inputs)
    outputs = {}
    for fused in (False, True):
        model.mask_decoder.transformer.fused_cross_attention = fused
        outputs[fused] = model.mask_decoder(*inputs[:4], True, inputs[4])
    assert fallback_counts() == {}
    torch.testing.assert_close(outputs[True][0], outputs[False][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outputs[True][1], outputs[False][1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_inputs", [False, True], ids=["shared-image", "mask-input-per-prompt"])
@torch.no_grad()
def test_sam2_decoder_with_the_kernels_equals_the_module_path(monkeypatch, mask_inputs):
    """SAM 2's two-way transformer is SAM 1's (sam2's MLP keys): the nano's decoder end to end, fp32,
    masks, IoUs, mask tokens and object scores, prompts of two images."""
    from tests.sam2_decoder_inputs import sam2_decoder_inputs

    monkeypatch.setattr(da, "_INTERPRET_BLOCK_L", 512)
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu")
    embeddings, pe, sparse, dense, high_res, index = sam2_decoder_inputs(model, 3, mask_inputs=mask_inputs)
    decoder, outputs = model.sam_mask_decoder, {}
    for fused in (False, True):
        decoder.transformer.fused_cross_attention = fused
        outputs[fused] = decoder.predict_masks(embeddings, pe, sparse, dense, False, high_res, index)
    assert fallback_counts() == {}
    for got, want in zip(outputs[True], outputs[False], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@torch.no_grad()
def test_padding_to_the_widest_gives_the_same_numbers(request, monkeypatch, dtype):
    """widest (SAM 2's compiled decoder: a width constant at trace time) pads SAM's 7 tokens to 16 per head,
    not 8: more zero columns, the same attention."""
    widths = []
    heads = da._heads
    monkeypatch.setattr(da, "_heads", lambda x, h, t_pad: widths.append(t_pad) or heads(x, h, t_pad))
    shape = SHAPES[0]  # SAM's widths, 7 tokens
    errors = (token_to_image_error(request, dtype, shape, run=functools.partial(token_to_image_attention, widest=True)),
              image_to_token_error(request, dtype, shape, run=functools.partial(image_to_token_attention, widest=True)))
    assert max(errors) < RELATIVE_TOLERANCE[dtype] and fallback_counts() == {}
    assert set(widths) == {da.max_fused_tokens(8)} == {16} and da._padded_tokens(7, 8) == 8


FEW = MIN_FUSED_PROMPTS - 1


@pytest.mark.parametrize("prompts,points,fused", [(MIN_FUSED_PROMPTS, 1, True), (MIN_FUSED_PROMPTS, 8, True),
                                                  (MIN_FUSED_PROMPTS, 9, False), (MIN_FUSED_PROMPTS, 16, False),
                                                  (FEW, 1, False)])
@torch.no_grad()
def test_compiled_sam2_decoder_routes_prompts_the_kernels_cannot_take_to_its_module_graph(prompts, points, fused,
                                                                                           monkeypatch):
    """SAM 2's compiled decoder has a graph for the kernels and one for the module path: prompts of fewer than
    16 tokens (6 output tokens, the points and sam2's padding point: 8 points) take the first, more take the
    second with the fallback counted, as the kernels count it outside a compiled graph; a call of fewer than
    MIN_FUSED_PROMPTS prompts takes the module graph by choice, no fallback. The compiled graphs are swapped
    for their eager functions here, the attention kernels for their math in torch ops (their arithmetic is
    tested above), the upscaling is its GEMM form (the interpreted upscaling kernel is tested in
    tests/unit/test_decoder_upscale.py and took most of this test's time) and the input is 256 (16 x 16 image
    tokens): 32 prompts on the interpreted kernels at 1024 took minutes."""
    from parity.tasks.video.produce import at_input_size
    from tests.decoder_kernel_ops import kernels_as_torch_ops
    from tests.sam2_decoder_inputs import sam2_decoder_inputs

    kernels_as_torch_ops(monkeypatch)
    model = at_input_size(samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32+compile+triton"), 256)
    decoder, taken = model.sam_mask_decoder, []
    assert decoder.upscale_impl == "triton"  # the stage's choice, swapped below for its GEMM form
    decoder.upscale_impl = "gemm"
    decoder.compiled_predict_masks = {
        route: (lambda *args, route=route, eager=eager: taken.append(route) or eager(*args))
        for route, eager in ((True, decoder._predict_masks_fused), (False, decoder._predict_masks_unfused))
    }
    embeddings, pe, sparse, dense, high_res, index = sam2_decoder_inputs(model, prompts, points_per_prompt=points)
    masks, *_ = decoder(embeddings, pe, sparse, dense, True, False, high_res, image_index=index)
    assert taken == [fused] and masks.shape == (prompts, 3, 64, 64)
    assert fallback_counts() == ({} if fused or prompts == FEW else {da.TOO_MANY_TOKENS: 1})
