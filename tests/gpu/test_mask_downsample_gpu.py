"""The mask downsampler's conv + norm + GELU kernel on the GPU, at the tracker's shapes (1024 x 1024 masks,
1 and 8 objects), against float64 math, and the whole downsampler on it against its module path.
Compiled inside the tracker it is held by tests/gpu/test_video_gpu.py: the triton stages against the fp32
golden, with the switch's proof that no call fell back."""

from __future__ import annotations

import pytest
import torch

from samfast.kernels import downsample_conv, downsample_conv_reference, fallback_counts
from samfast.sam2.memory.encoder import MaskDownSampler
from tests.kernel_accuracy import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("triton_compiled")]

pytest.importorskip("triton", reason="Triton is not installed")

# max |kernel - fp64 on the same rounded inputs| relative to max |fp64|: the kernel rounds once, at its output
MAX_RELATIVE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def first_two_convs(downsampler: MaskDownSampler):
    """(conv, norm) of the convs the kernel takes: the first two (1 and 4 input channels)."""
    return [(downsampler.encoder[i], downsampler.encoder[i + 1]) for i in (0, 3)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("objects", [1, 8])
@torch.no_grad()
def test_the_first_two_convs_match_fp64_at_the_trackers_shapes(dtype, objects):
    """The mask (objects, 1, 1024, 1024) through its channels-last view, then the first kernel's output:
    each kernel against fp64 math on its inputs and weights as the kernel reads them (rounded to the dtype)."""
    torch.manual_seed(0)
    downsampler = MaskDownSampler(256).cuda().to(dtype)
    x = torch.sigmoid(torch.randn(objects, 1, 1024, 1024, device="cuda") * 4).to(dtype).permute(0, 2, 3, 1)
    for i, (conv, norm) in enumerate(first_two_convs(downsampler)):
        params = conv.weight, conv.bias, norm.weight, norm.bias
        got = downsample_conv(x, *params, norm.eps)
        assert fallback_counts() == {}, "the kernel did not run"
        want = downsample_conv_reference(x.double(), *(p.double() for p in params), norm.eps)
        assert relative_error(got, want) < MAX_RELATIVE[dtype], f"conv {i}"
        x = got


@pytest.mark.parametrize("objects", [1, 8])
@torch.no_grad()
def test_downsampler_on_the_kernel_in_bf16_stays_as_close_to_fp64_as_the_module_path(objects):
    """bf16 against the fp64 downsampler: the kernel path (channels-last, the 1x1 conv a GEMM) no further
    than the module path. With 4 channels to normalize over, the first norm magnifies bf16's rounding of the
    mask: both paths' errors are of the order of 1e-2."""
    torch.manual_seed(0)
    downsampler = MaskDownSampler(256).cuda().double()
    masks = torch.sigmoid(torch.randn(objects, 1, 1024, 1024, device="cuda", dtype=torch.float64) * 4)
    want = downsampler(masks)
    downsampler.bfloat16()
    module_err = relative_error(downsampler(masks.bfloat16()), want)
    downsampler.conv_impl = "triton"
    err = relative_error(downsampler(masks.bfloat16()), want)
    assert fallback_counts() == {}, "the kernel did not run"
    assert err < 1.5 * module_err, f"kernel path {err:.2e}, module path {module_err:.2e}"
