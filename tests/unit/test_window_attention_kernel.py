"""Hiera's small-window attention kernel against float64 math, on the CPU through TRITON_INTERPRET=1.

q, k and v come as Hiera makes them: views of its qkv projection's output (B, L, 3, H, D) and, for a
block that pools its queries, a max-pooled q of other strides; head widths of every Hiera (32 to 96
channels, none a power of 2 but 32). The planted-defect tests feed the kernel subtly wrong inputs
(every window reading the first window's keys, the scale dropped, keys and values swapped) and
require the same tolerance to reject them; a key count that is no power of 2 checks that the padded
keys take no part in the softmax.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="Triton is not installed")

import samfast  # noqa: E402
from samfast.kernels import fallback_counts, window_attention  # noqa: E402
from samfast.kernels.window_attention import MAX_KEYS, MAX_QUERIES, fits  # noqa: E402
from tests.kernel_accuracy import node_seed, relative_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreted")

wa = importlib.import_module("samfast.kernels.window_attention")

# max |kernel - fp64| relative to max |fp64|: fp32 (IEEE products) measured at 1e-7 to 3e-7, fp16 at
# 2e-4 to 4e-4; the planted defects at 0.1 and above, so a defect must exceed 5x the tolerance
RELATIVE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
PLANTED_FACTOR = 5

# (windows B, heads H, queries, keys, head channels D, queries pooled from the keys' windows)
SHAPES = [
    (6, 4, 16, 16, 72, False),  # Hiera-L's second stage: 4 x 4 windows
    (4, 4, 16, 64, 72, True),  # its first block: queries pooled 2 x 2 from 8 x 8 windows
    (8, 8, 4, 16, 72, True),  # the third stage's first block: 2 x 2 queries from 4 x 4 windows
    (3, 2, 16, 16, 96, False),  # Hiera-T's heads
    (3, 4, 16, 64, 56, True),  # Hiera-B+'s
    (5, 2, 9, 40, 32, False),  # no power of 2: padded queries and keys
    (3, 2, 16, 16, 8, False),  # heads narrower than tl.dot's least: one masked tile of 16
]
SHAPE_IDS = ["l-stage2", "l-pooled-8x8", "l-pooled-4x4", "t-heads-96", "b+-heads-56", "odd-counts", "heads-8"]


def hiera_inputs(seed: int, shape, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, H, L, D) as Hiera's attention hands them on: transposed views of one qkv tensor,
    a pooled q max-pooled over its window's keys as Hiera's q_pool does (other strides)."""
    windows, heads, queries, keys, d, pooled = shape
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(windows, keys, 3, heads, d, generator=g).to(dtype)
    q, k, v = qkv.unbind(2)
    if pooled:
        side, stride = int(keys**0.5), int((keys // queries) ** 0.5)
        grid = q.reshape(windows, side, side, heads * d).permute(0, 3, 1, 2)
        q = F.max_pool2d(grid, stride).permute(0, 2, 3, 1).reshape(windows, queries, heads, d)
    elif queries != keys:
        q = torch.randn(windows, queries, heads, d, generator=g).to(dtype)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def error(request, dtype, shape, run=window_attention) -> float:
    q, k, v = hiera_inputs(node_seed(request), shape, dtype)
    scale = shape[4] ** -0.5
    got = run(q, k, v, scale)
    assert got.shape == q.shape and got.dtype == dtype
    assert got.transpose(1, 2).is_contiguous(), "the output is (B, L, H, D) memory"
    return relative_error(got, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@torch.no_grad()
def test_window_attention_matches_fp64(request, dtype, shape):
    assert error(request, dtype, shape) < RELATIVE_TOLERANCE[dtype]
    assert fallback_counts() == {}, "the kernel did not run"


def _first_window_keys(run_kernel):
    return lambda q, k, v, scale: run_kernel(q, k[:1].expand_as(k), v, scale)


def _scale_dropped(run_kernel):
    return lambda q, k, v, scale: run_kernel(q, k, v, 1.0)


def _keys_for_values(run_kernel):
    return lambda q, k, v, scale: run_kernel(q, v, k, scale)


@pytest.mark.parametrize("plant", [_first_window_keys, _scale_dropped, _keys_for_values],
                         ids=["first-window-keys", "scale-dropped", "keys-for-values"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@torch.no_grad()
def test_planted_defects_exceed_the_tolerance(request, monkeypatch, dtype, plant):
    monkeypatch.setattr(wa, "_run", plant(wa._run))
    assert error(request, dtype, SHAPES[1]) > PLANTED_FACTOR * RELATIVE_TOLERANCE[dtype]


@torch.no_grad()
@torch.no_grad()
def test_a_head_without_its_tail_tile_exceeds_the_tolerance(request, monkeypatch):
    """Planted: the channels past the first power of 2 (72 = 64 + 8) never computed; NaN counts as failing."""
    monkeypatch.setattr(wa, "split_channels", lambda d: (1 << (d.bit_length() - 1), 0))
    assert not error(request, torch.float32, SHAPES[0]) <= PLANTED_FACTOR * RELATIVE_TOLERANCE[torch.float32]


def test_split_channels_covers_each_head_in_two_tiles():
    assert wa.split_channels(72) == (64, 16) and wa.split_channels(96) == (64, 32)
    assert wa.split_channels(56) == (32, 32) and wa.split_channels(64) == (64, 0)
    assert wa.split_channels(128) == (128, 0) and wa.split_channels(8) == (16, 0)


def test_windows_too_large_take_sdpa_and_count_it():
    q = torch.randn(2, 2, MAX_QUERIES * 4, 32)
    out = window_attention(q, q, q, 0.2)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q, scale=0.2))
    (reason,) = fallback_counts()
    assert "queries" in reason


@torch.no_grad()
def test_bf16_under_the_interpreter_falls_back_with_its_reason():
    q = torch.randn(2, 2, 16, 32, dtype=torch.bfloat16)
    window_attention(q, q, q, 0.2)
    assert fallback_counts() == {"dtype bfloat16 not supported by the Triton interpreter": 1}


def test_mismatched_shapes_are_refused_with_the_shapes():
    q, k = torch.randn(2, 2, 16, 32), torch.randn(2, 2, 16, 24)
    with pytest.raises(ValueError, match=r"\(2, 2, 16, 32\), \(2, 2, 16, 24\)"):
        window_attention(q, k, k, 0.2)


def test_fits_the_measured_window_sizes():
    assert fits(16, 16) and fits(16, 64) and fits(4, 16)
    assert not fits(64, 64) and not fits(16, MAX_KEYS + 1) and not fits(256, 256)


@pytest.mark.parametrize("model_type, taken", [
    ("sam2.1_hiera_t", [1, 2, 3]),  # the pooled block into stage 2, stage 2, the pooled block into stage 3
    ("sam2.1_hiera_l", [2, 3, 4, 5, 6, 7, 8]),
])
def test_the_triton_switch_takes_hieras_small_windows(model_type, taken):
    model = samfast.build_sam(model_type, device="meta", stages="fp32+triton")
    modules = model.triton_attention_modules()
    assert list(modules) == [f"image_encoder.trunk.blocks.{i}.attn" for i in taken]
    assert all(module.attn_impl == "triton" for module in modules.values())
    others = [m.attn_impl for name, m in model.attention_modules().items() if name not in modules and "trunk" in name]
    assert others and set(others) == {"math"}  # fp32 without sdpa: the rest keep the switch below


@torch.no_grad()
def test_hiera_on_the_kernel_equals_hiera_on_sdpa():
    """The seeded nano's trunk (256 x 256 input: its pooled block's 8 x 8 windows and the next one's 4 x 4)
    with the switch's attentions on the kernel, against the same trunk on SDPA, fp32."""
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32+sdpa")
    trunk = model.image_encoder.trunk
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(0))
    want = trunk(x)
    for module in model.triton_attention_modules().values():
        module.attn_impl = "triton"
    got = trunk(x)
    assert fallback_counts() == {}, "the kernel did not run"
    for level, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m: f"level {level}: {m}")
