"""The decoder's fused upscaling kernel against float64 math, on the CPU through TRITON_INTERPRET=1.

The reference is samfast.kernels.upscaled_masks_reference (the GEMM form of SAM's two transposed
convolutions, layer norm, GELUs and mask product) run in float64 on the same weights. The
planted-defect tests hand the kernel a subtly wrong upscaling (the sub-pixels of a 2x2 block
swapped, the layer norm's scale dropped) and require the same tolerance to reject it.
"""

from __future__ import annotations

import copy
import importlib
import logging

import pytest
import torch
from torch import nn

pytest.importorskip("triton", reason="Triton is not installed")

import samfast  # noqa: E402
from samfast.kernels import fallback_counts, upscaled_masks, upscaled_masks_reference  # noqa: E402
from samfast.modeling.common import LayerNorm2d  # noqa: E402
from tests.decoder_inputs import decoder_inputs  # noqa: E402
from tests.kernel_accuracy import node_seed, relative_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreted")

mu = importlib.import_module("samfast.kernels.mask_upscale")

# max |kernel - fp64| relative to max |fp64|: fp32 (IEEE products) sits near 1e-6, fp16 near 1e-3
RELATIVE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


def make_upscaling(seed: int, c: int, c1: int, c2: int) -> nn.Sequential:
    """SAM's output_upscaling at these widths, with random (not default) norm parameters."""
    torch.manual_seed(seed)
    upscaling = nn.Sequential(
        nn.ConvTranspose2d(c, c1, kernel_size=2, stride=2),
        LayerNorm2d(c1),
        nn.GELU(),
        nn.ConvTranspose2d(c1, c2, kernel_size=2, stride=2),
        nn.GELU(),
    )
    with torch.no_grad():
        upscaling[1].weight.normal_(1.0, 0.3)
        upscaling[1].bias.normal_(0.0, 0.3)
    return upscaling


def make_inputs(seed: int, p: int, h: int, w: int, c: int, c2: int, m: int, dtype):
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(p, h * w, c, generator=g).to(dtype).view(p, h, w, c)  # the transformer's tokens, viewed
    hyper_in = torch.randn(p, m, c2, generator=g).to(dtype)
    return src, hyper_in


def fp64_masks(src, upscaling, hyper_in):
    return upscaled_masks_reference(src.double(), copy.deepcopy(upscaling).double(), hyper_in.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "p, h, w, c, c1, c2, m",
    [
        (2, 3, 5, 256, 64, 32, 4),  # SAM's widths; 60 rows: one partial tile
        (3, 5, 7, 64, 16, 16, 4),  # 140 rows over 3 tiles of 64
        (1, 4, 4, 32, 32, 16, 1),  # one mask (the single-mask output)
    ],
)
@torch.no_grad()
def test_kernel_matches_fp64(request, dtype, p, h, w, c, c1, c2, m):
    upscaling = make_upscaling(node_seed(request), c, c1, c2)
    src, hyper_in = make_inputs(node_seed(request), p, h, w, c, c2, m, dtype)
    got = upscaled_masks(src, upscaling.to(dtype), hyper_in)
    assert fallback_counts() == {}, "the kernel did not run"
    assert got.shape == (p, m, 4 * h, 4 * w) and got.dtype == dtype
    assert relative_error(got, fp64_masks(src, upscaling, hyper_in)) < RELATIVE_TOLERANCE[dtype]


@torch.no_grad()
def test_strided_tokens(request):
    """src as a non-contiguous view (every other prompt of a larger batch): strides are honoured."""
    upscaling = make_upscaling(node_seed(request), 64, 16, 16)
    src, hyper_in = make_inputs(node_seed(request), 4, 3, 6, 64, 16, 4, torch.float32)
    src, hyper_in = src[::2], hyper_in[::2]
    assert not src.is_contiguous()
    got = upscaled_masks(src, upscaling, hyper_in)
    assert fallback_counts() == {}
    assert relative_error(got, fp64_masks(src, upscaling, hyper_in)) < RELATIVE_TOLERANCE[torch.float32]


def _swap_sub_pixels(upscaling: nn.Sequential) -> nn.Sequential:
    planted = copy.deepcopy(upscaling)
    with torch.no_grad():
        planted[3].weight.copy_(planted[3].weight.transpose(2, 3).clone())  # out[2i + b, 2j + a] instead of [2i + a, 2j + b]
    return planted


def _drop_norm_scale(upscaling: nn.Sequential) -> nn.Sequential:
    planted = copy.deepcopy(upscaling)
    with torch.no_grad():
        planted[1].weight.fill_(1.0)
    return planted


@pytest.mark.parametrize("plant", [_swap_sub_pixels, _drop_norm_scale], ids=["sub-pixels-swapped", "norm-scale-dropped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@torch.no_grad()
def test_planted_defect_is_caught(request, plant, dtype):
    upscaling = make_upscaling(node_seed(request), 64, 16, 16)
    src, hyper_in = make_inputs(node_seed(request), 2, 3, 5, 64, 16, 4, dtype)
    got = upscaled_masks(src, plant(upscaling).to(dtype), hyper_in)
    assert fallback_counts() == {}
    assert relative_error(got, fp64_masks(src, upscaling, hyper_in)) > 10 * RELATIVE_TOLERANCE[dtype]


@torch.no_grad()
def test_cpu_without_interpreter_falls_back_visibly(request, monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET")
    upscaling = make_upscaling(node_seed(request), 64, 16, 16)
    src, hyper_in = make_inputs(node_seed(request), 2, 3, 5, 64, 16, 4, torch.float32)
    with caplog.at_level(logging.WARNING, logger="samfast.kernels"):
        got = upscaled_masks(src, upscaling, hyper_in)
    assert fallback_counts() == {"cpu tensors without TRITON_INTERPRET=1": 1}
    assert any("upscaled_masks" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(got, upscaled_masks_reference(src, upscaling, hyper_in), rtol=0, atol=0)


@pytest.mark.parametrize(
    "change, reason_part",
    [
        (lambda up: up[2].__init__(approximate="tanh"), "exact GELU"),
        (lambda up: setattr(up[0], "stride", (1, 1)), "2x2 stride 2"),
    ],
    ids=["tanh-gelu", "stride-1"],
)
@torch.no_grad()
def test_other_upscalings_fall_back(request, change, reason_part):
    upscaling = make_upscaling(node_seed(request), 64, 16, 16)
    change(upscaling)
    src, hyper_in = make_inputs(node_seed(request), 1, 2, 2, 64, 16, 4, torch.float32)
    upscaled_masks(src, upscaling, hyper_in)
    (reason,) = fallback_counts()
    assert reason_part in reason


@torch.no_grad()
def test_decoder_with_the_kernel_equals_the_gemm_path(request, monkeypatch):
    """The trained-shape decoder of vit_tiny (64x64 tokens, 256 channels) end to end, fp32."""
    monkeypatch.setattr(mu, "_INTERPRET_BLOCK_R", 256)  # fewer interpreted programs: same arithmetic
    model = samfast.build_sam("vit_tiny", device="cpu")
    inputs = decoder_inputs(model, 3)
    assert_kernel_equals_the_gemm_path(model.mask_decoder, lambda: model.mask_decoder(*inputs[:4], True, inputs[4]))


def assert_kernel_equals_the_gemm_path(decoder, decode) -> None:
    """decode() with the decoder's upscaling on the GEMM path, then on the kernel: masks within fp32
    rounding, the IoU predictions (computed before the upscaling) identical, and no fallback."""
    outputs = {}
    for impl in ("gemm", "triton"):
        decoder.upscale_impl = impl
        outputs[impl] = decode()
    assert fallback_counts() == {}
    torch.testing.assert_close(outputs["triton"][0], outputs["gemm"][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outputs["triton"][1], outputs["gemm"][1], rtol=0, atol=0)


@torch.no_grad()
def test_mismatched_shapes_are_refused_with_the_expected_ones(request):
    upscaling = make_upscaling(node_seed(request), 64, 16, 16)
    src, hyper_in = make_inputs(node_seed(request), 2, 3, 5, 64, 16, 4, torch.float32)
    with pytest.raises(ValueError, match=r"hyper_in \(P, masks, 16\)"):
        upscaled_masks(src, upscaling, hyper_in[..., :8])
    with pytest.raises(ValueError, match=r"src \(P, h, w, 64\)"):
        upscaled_masks(src[..., :32], upscaling, hyper_in)


# --- SAM 2: the high-resolution levels, read per prompt's image -------------------------------------


def make_high_res(seed: int, n: int, h: int, w: int, c1: int, c2: int, dtype):
    """SAM 2's stride-8 and stride-4 levels of n images, NCHW (n, c1, 2h, 2w) and (n, c2, 4h, 4w)."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(n, c1, 2 * h, 2 * w, generator=g).to(dtype), torch.randn(n, c2, 4 * h, 4 * w, generator=g).to(dtype)


def fp64_sam2_masks(src, upscaling, hyper_in, high_res, image_index):
    """The reference with each prompt's own image's levels gathered, channels-last, in float64."""
    gathered = tuple(feat.double().index_select(0, image_index).permute(0, 2, 3, 1) for feat in high_res)
    return upscaled_masks_reference(src.double(), copy.deepcopy(upscaling).double(), hyper_in.double(), gathered)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "p, h, w, c, c1, c2, m, images",
    [
        (3, 3, 5, 256, 64, 32, 4, 2),  # SAM 2's widths, prompts of two images
        (2, 4, 2, 64, 16, 16, 1, 1),  # one image for every prompt, one mask
    ],
)
@torch.no_grad()
def test_kernel_with_high_res_levels_matches_fp64(request, dtype, p, h, w, c, c1, c2, m, images):
    upscaling = make_upscaling(node_seed(request), c, c1, c2)
    src, hyper_in = make_inputs(node_seed(request), p, h, w, c, c2, m, dtype)
    high_res = make_high_res(node_seed(request), images, h, w, c1, c2, dtype)
    image_index = torch.arange(p) % images
    got = upscaled_masks(src, upscaling.to(dtype), hyper_in, high_res, image_index)
    assert fallback_counts() == {}, "the kernel did not run"
    want = fp64_sam2_masks(src, upscaling, hyper_in, high_res, image_index)
    assert relative_error(got, want) < RELATIVE_TOLERANCE[dtype]


def _transposed(feat: torch.Tensor) -> torch.Tensor:
    """A level read at (x, y) instead of (y, x): square maps, so the shape stays right."""
    return feat.transpose(2, 3).contiguous()


@pytest.mark.parametrize("plant", ["images-swapped", "stride-8-transposed", "stride-4-transposed"])
@torch.no_grad()
def test_planted_high_res_defect_is_caught(request, plant):
    """Each level must reach its own prompt's image and its own pixels."""
    upscaling = make_upscaling(node_seed(request), 64, 16, 16)
    src, hyper_in = make_inputs(node_seed(request), 2, 4, 4, 64, 16, 4, torch.float32)
    s1, s0 = make_high_res(node_seed(request), 2, 4, 4, 16, 16, torch.float32)
    image_index = torch.tensor([0, 1])
    given = {"images-swapped": ((s1, s0), image_index.flip(0)), "stride-8-transposed": ((_transposed(s1), s0), image_index),
             "stride-4-transposed": ((s1, _transposed(s0)), image_index)}[plant]
    got = upscaled_masks(src, upscaling, hyper_in, *given)
    assert fallback_counts() == {}
    want = fp64_sam2_masks(src, upscaling, hyper_in, (s1, s0), image_index)
    assert relative_error(got, want) > 10 * RELATIVE_TOLERANCE[torch.float32]


@torch.no_grad()
def test_sam2_decoder_with_the_kernel_equals_the_gemm_path(monkeypatch):
    """The nano's decoder (SAM 2's widths, 64x64 tokens) end to end, fp32, prompts of two images."""
    from tests.sam2_decoder_inputs import sam2_decoder_inputs

    monkeypatch.setattr(mu, "_INTERPRET_BLOCK_R", 256)
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu")
    embeddings, pe, sparse, dense, high_res, index = sam2_decoder_inputs(model, 3)
    decoder = model.sam_mask_decoder
    assert_kernel_equals_the_gemm_path(
        decoder, lambda: decoder.predict_masks(embeddings, pe, sparse, dense, False, high_res, index))


@torch.no_grad()
def test_high_res_levels_of_the_wrong_size_are_refused(request):
    upscaling = make_upscaling(node_seed(request), 64, 16, 16)
    src, hyper_in = make_inputs(node_seed(request), 2, 3, 5, 64, 16, 4, torch.float32)
    s1, s0 = make_high_res(node_seed(request), 1, 3, 5, 16, 16, torch.float32)
    with pytest.raises(ValueError, match=r"need high_res levels \(1, 16, 6, 10\) and \(1, 16, 12, 20\)"):
        upscaled_masks(src, upscaling, hyper_in, (s1, s0[..., :-4]))
