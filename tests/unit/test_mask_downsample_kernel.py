"""The mask downsampler's conv + norm + GELU kernel against float64 math, on the CPU through TRITON_INTERPRET=1.

Inputs come as the memory encoder makes them: the first conv reads the (B, 1, H, W) mask through its
channels-last permute (a view), the second the first kernel's contiguous channels-last output; also
channels-last views of NCHW maps of more channels, and sam2's widths (1 -> 4 -> 16) beside other powers
of 2 on small maps, odd sides among them (the padding's last row and column). The planted-defect tests
feed the kernel subtly wrong inputs (the map shifted by a pixel, the taps transposed, the conv's bias
dropped, the norm's weight and bias swapped, the last output row not written) and require the same
tolerance to reject them.
"""

from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

import samfast  # noqa: E402
from samfast.kernels import downsample_conv, fallback_counts  # noqa: E402
from tests.kernel_accuracy import node_seed, relative_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreted")

md = importlib.import_module("samfast.kernels.mask_downsample")


@pytest.fixture(autouse=True)
def several_programs_a_map(monkeypatch):
    """Blocks of 64 output pixels: each test map spans several programs, the last one partly empty (the
    interpreter's default block holds a whole small map)."""
    monkeypatch.setattr(md, "_INTERPRET_BLOCK_P", 64)

# max |kernel - fp64| relative to max |fp64|: fp32 measured at 1.1e-7 to 2.2e-7, fp16 at 2.0e-4 to
# 3.3e-4 (its rounding of the map, the weights and the result); the planted defects at 0.55 and above, so a
# defect must exceed 5x the tolerance
RELATIVE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
PLANTED_FACTOR = 5
EPS = 1e-6

# (batch B, input channels C, output channels COUT, height, width, the map contiguous channels-last or a view of NCHW)
SHAPES = [
    (2, 1, 4, 34, 32, False),  # the first conv: one channel, the mask's NCHW permuted
    (2, 4, 16, 17, 18, True),  # the second, on the first kernel's output; an odd height: the last row half padding
    (1, 2, 64, 12, 11, False),  # wider outputs, an odd width
    (3, 8, 32, 9, 8, False),  # the most input channels the kernel takes
]
SHAPE_IDS = ["first-conv", "second-conv-odd-height", "wide-odd-width", "eight-channels"]


def conv_inputs(seed: int, shape, dtype):
    """x (B, H, W, C) channels-last, the conv's and norm's weights."""
    batch, c, cout, h, w, contiguous = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, c, h, w, generator=g).permute(0, 2, 3, 1)
    weight = torch.randn(cout, c, 3, 3, generator=g) * (9 * c) ** -0.5
    bias, norm_weight, norm_bias = (torch.randn(cout, generator=g) for _ in range(3))
    return tuple(t.to(dtype) for t in (x.contiguous() if contiguous else x, weight, bias, norm_weight, norm_bias))


def error(request, dtype, shape, run=downsample_conv) -> float:
    inputs = conv_inputs(node_seed(request), shape, dtype)
    got = run(*inputs, EPS)
    batch, _, cout, h, w, _ = shape
    assert got.shape == (batch, (h + 1) // 2, (w + 1) // 2, cout) and got.dtype == dtype and got.is_contiguous()
    return relative_error(got, md.downsample_conv_reference(*(t.double() for t in inputs), EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@torch.no_grad()
def test_downsample_conv_matches_fp64(request, dtype, shape):
    assert error(request, dtype, shape) < RELATIVE_TOLERANCE[dtype]
    assert fallback_counts() == {}, "the kernel did not run"


def _shifted_a_pixel(run_kernel):
    return lambda x, w, b, nw, nb, eps: run_kernel(x.roll(1, dims=2), w, b, nw, nb, eps)


def _taps_transposed(run_kernel):
    return lambda x, w, b, nw, nb, eps: run_kernel(x, w.transpose(2, 3).contiguous(), b, nw, nb, eps)


def _bias_dropped(run_kernel):
    return lambda x, w, b, nw, nb, eps: run_kernel(x, w, torch.zeros_like(b), nw, nb, eps)


def _norm_affine_swapped(run_kernel):
    return lambda x, w, b, nw, nb, eps: run_kernel(x, w, b, nb, nw, eps)


def _last_row_skipped(run_kernel):
    """Every output row but the last, which stays the output's empty memory (zeros here)."""
    def run(x, w, b, nw, nb, eps):
        out = run_kernel(x, w, b, nw, nb, eps)
        return torch.cat([out[:, :-1], torch.zeros_like(out[:, -1:])], dim=1)
    return run


@pytest.mark.parametrize("plant", [_shifted_a_pixel, _taps_transposed, _bias_dropped, _norm_affine_swapped,
                                   _last_row_skipped],
                         ids=["shifted-a-pixel", "taps-transposed", "bias-dropped", "norm-affine-swapped",
                              "last-row-skipped"])
@pytest.mark.parametrize("shape", SHAPES[:2], ids=SHAPE_IDS[:2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@torch.no_grad()
def test_planted_defects_exceed_the_tolerance(request, monkeypatch, dtype, shape, plant):
    monkeypatch.setattr(md, "_run", plant(md._run))
    assert error(request, dtype, shape) > PLANTED_FACTOR * RELATIVE_TOLERANCE[dtype]


@torch.no_grad()
def test_bf16_under_the_interpreter_falls_back_with_its_reason():
    inputs = conv_inputs(0, SHAPES[1], torch.bfloat16)
    torch.testing.assert_close(downsample_conv(*inputs, EPS), md.downsample_conv_reference(*inputs, EPS))
    assert fallback_counts() == {"dtype bfloat16 not supported by the Triton interpreter": 1}


@pytest.mark.parametrize("channels", [3, 16], ids=["three", "sixteen"])
@torch.no_grad()
def test_widths_the_kernel_does_not_take_go_to_the_reference_and_are_counted(channels):
    inputs = conv_inputs(0, (1, channels, 32, 8, 8, True), torch.float32)
    torch.testing.assert_close(downsample_conv(*inputs, EPS), md.downsample_conv_reference(*inputs, EPS))
    assert fallback_counts() == {"conv channels not powers of 2 (the inputs at most 8)": 1}


def test_a_weight_of_another_width_is_refused_with_the_shapes():
    x, weight, bias, norm_weight, norm_bias = conv_inputs(0, SHAPES[1], torch.float32)
    with pytest.raises(ValueError, match=r"\(2, 17, 18, 4\), \(16, 2, 3, 3\)"):
        downsample_conv(x, weight[:, :2], bias, norm_weight, norm_bias, EPS)


@torch.no_grad()
def test_mask_downsampler_on_the_kernel_equals_the_module_path():
    """The seeded nano's mask downsampler (a 256 x 256 mask to 16 x 16: the first two convs on the kernel,
    the others on their modules channels-last, the 1x1 conv as a GEMM) against its module path, fp32; the
    result channels-last."""
    downsampler = samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32").memory_encoder.mask_downsampler
    masks = torch.sigmoid(torch.randn(2, 1, 256, 256, generator=torch.Generator().manual_seed(2)) * 4)
    want = downsampler(masks)
    downsampler.conv_impl = "triton"
    got = downsampler(masks)
    assert fallback_counts() == {}, "the kernel did not run"
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
