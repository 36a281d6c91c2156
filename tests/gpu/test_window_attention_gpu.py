"""Hiera's small-window attention kernel on the GPU, at Hiera-L's shapes (a batch of 2 images), against
float64 math; and compiled inside a seeded Hiera trunk (bf16), where it must run without a fallback and
keep SDPA's outputs (the triton stages of tests/gpu/test_sam2_gpu.py hold the whole model to fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import samfast
from samfast.kernels import fallback_counts, window_attention
from tests.kernel_accuracy import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("triton_compiled")]

pytest.importorskip("triton", reason="Triton is not installed")

# max |kernel - fp64| relative to max |fp64|, SDPA's own error on the same inputs beside it
MAX_RELATIVE = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-3}

# Hiera-L at 1024 x 1024, 2 images: (windows, heads, queries, keys): stage 2's 4 x 4 windows, its first
# block's queries pooled from 8 x 8 windows, stage 3's first block's from 4 x 4
SHAPES = [(2048, 4, 16, 16), (2048, 4, 16, 64), (2048, 8, 4, 16)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=["stage2", "pooled-8x8", "pooled-4x4"])
@torch.no_grad()
def test_window_attention_matches_fp64_at_hiera_l_shapes(dtype, shape):
    windows, heads, queries, keys = shape
    torch.manual_seed(0)
    qkv = torch.randn(windows, keys, 3, heads, 72, device="cuda").to(dtype)
    _, k, v = (x.transpose(1, 2) for x in qkv.unbind(2))
    q = torch.randn(windows, queries, heads, 72, device="cuda").to(dtype).transpose(1, 2)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=72**-0.5)
    got = window_attention(q, k, v, 72**-0.5)
    assert fallback_counts() == {}, "the kernel did not run"
    err = relative_error(got, want)
    sdpa_err = relative_error(F.scaled_dot_product_attention(q, k, v, scale=72**-0.5), want)
    assert err < MAX_RELATIVE[dtype], f"kernel {err:.2e}, SDPA {sdpa_err:.2e}"


@torch.no_grad()
def test_compiled_trunk_runs_the_kernel_and_keeps_sdpas_outputs():
    """hiera_t_5block (blocks 1 and 2 on the kernel: 16 queries of 64 keys, 4 of 16) at 512 x 512: a
    fraction of hiera_t's compile time in the gate's GPU layer."""
    model = samfast.build_sam("sam2.1_hiera_t_5block", device="cuda", stages="bf16+sdpa")
    trunk = model.image_encoder.trunk
    x = torch.randn(2, 3, 512, 512, device="cuda", dtype=torch.bfloat16)
    want = trunk(x)
    taken = model.triton_attention_modules()
    assert list(taken) == ["image_encoder.trunk.blocks.1.attn", "image_encoder.trunk.blocks.2.attn"]
    for module in taken.values():
        module.attn_impl = "triton"
    got = torch.compile(trunk, fullgraph=True, dynamic=False)(x)
    assert fallback_counts() == {}, "the kernel did not run"
    for level, (g, w) in enumerate(zip(got, want, strict=True)):
        err = relative_error(g, w)
        assert err < 3e-2, f"level {level}: {err:.2e}"
