"""The memory keys' projection-and-rotation kernel against float64 math, on the CPU through TRITON_INTERPRET=1.

Inputs come as the memory attention makes them: the memory plus its encodings, a (B, tokens, mem_dim)
view of the tracker's sequence-first (tokens, B, mem_dim) memory, several frames of the queries' map
each; the maps of the nano at its 256 input (16 x 16) and smaller, token counts that leave the last block
of a program partly empty. The planted-defect tests feed the kernel subtly wrong inputs (the rotations of
the neighbouring position, the bias dropped, each pair's two weights swapped, no rotation, the last
frame not written) and require
the same tolerance to reject them.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="Triton is not installed")

import samfast  # noqa: E402
from samfast.kernels import fallback_counts  # noqa: E402
from samfast.kernels import rotated_keys as rotated_keys_kernel  # noqa: E402
from samfast.modeling.rope import axial_rotations, rotated_keys_reference  # noqa: E402
from tests.kernel_accuracy import node_seed, relative_error  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreted")

rk = importlib.import_module("samfast.kernels.rotated_keys")


def rotated_keys(x, weight, bias, rotations):
    """The kernel with the memory attention's module path as its fallback."""
    return rotated_keys_kernel(x, weight, bias, rotations, reference=rotated_keys_reference)

# max |kernel - fp64| relative to max |fp64|: fp32 (IEEE products) measured at 1.2e-7 to 2.8e-7, fp16 at
# 2.9e-4 to 4.1e-4 (its rounding of x and of the keys); the planted defects at 0.39 and above, so a defect
# must exceed 5x the tolerance
RELATIVE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
PLANTED_FACTOR = 5

# (batch B, frames, map side, mem_dim K, channels C)
SHAPES = [
    (2, 3, 16, 64, 256),  # the nano at 256: 16 x 16 maps, sam2's widths
    (1, 7, 8, 64, 256),  # one object, a full memory of 7 frames
    (3, 2, 6, 16, 32),  # 36 tokens a frame: the last program's block partly empty
]
SHAPE_IDS = ["nano-256", "one-object-7-frames", "narrow-odd-map"]


def memory_inputs(seed: int, shape, dtype):
    """x (B, frames * L, K) as a view of sequence-first memory, weight, bias, rotations (2, L, C)."""
    batch, frames, side, k, c = shape
    g = torch.Generator().manual_seed(seed)
    memory = torch.randn(frames * side * side, batch, k, generator=g).to(dtype)
    weight = (torch.randn(c, k, generator=g) * k**-0.5).to(dtype)
    bias = torch.randn(c, generator=g).to(dtype)
    return memory.transpose(0, 1), weight, bias, axial_rotations(c, side, side)


def fp64_keys(x, weight, bias, rotations):
    """Each frame's projected tokens times their rotation, as complex numbers in float64."""
    keys = F.linear(x.double(), weight.double(), bias.double())
    frames = keys.unflatten(1, (-1, rotations.shape[1])).unflatten(-1, (-1, 2))
    cos, sin = rotations[0, :, 0::2].double(), rotations[1, :, 1::2].double()
    turned = torch.view_as_complex(frames.contiguous()) * torch.complex(cos, sin)
    return torch.view_as_real(turned).flatten(-2).flatten(1, 2)


def error(request, dtype, shape, run=rotated_keys) -> float:
    inputs = memory_inputs(node_seed(request), shape, dtype)
    got = run(*inputs)
    x, weight, _, _ = inputs
    assert got.shape == (x.shape[0], x.shape[1], weight.shape[0]) and got.dtype == dtype
    return relative_error(got, fp64_keys(*inputs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@torch.no_grad()
def test_rotated_keys_match_fp64(request, dtype, shape):
    assert error(request, dtype, shape) < RELATIVE_TOLERANCE[dtype]
    assert fallback_counts() == {}, "the kernel did not run"


def _neighbour_rotations(run_kernel):
    return lambda x, w, b, rot: run_kernel(x, w, b, rot.roll(1, dims=1).contiguous())


def _bias_dropped(run_kernel):
    return lambda x, w, b, rot: run_kernel(x, w, torch.zeros_like(b), rot)


def _pair_weights_swapped(run_kernel):
    return lambda x, w, b, rot: run_kernel(x, w.unflatten(0, (-1, 2)).flip(1).flatten(0, 1).contiguous(), b, rot)


def _not_rotated(run_kernel):
    identity = lambda rot: torch.stack([torch.ones_like(rot[0]), torch.zeros_like(rot[1])])  # noqa: E731
    return lambda x, w, b, rot: run_kernel(x, w, b, identity(rot))


def _last_frame_skipped(run_kernel):
    """Every frame but the last: the frame loop one short, its keys left as the output's empty memory."""
    def run(x, w, b, rot):
        frame_tokens = rot.shape[1]
        head = run_kernel(x[:, :-frame_tokens], w, b, rot)
        return torch.cat([head, torch.zeros_like(head[:, :frame_tokens])], dim=1)
    return run


@pytest.mark.parametrize("plant", [_neighbour_rotations, _bias_dropped, _pair_weights_swapped, _not_rotated,
                                   _last_frame_skipped],
                         ids=["neighbour-rotations", "bias-dropped", "pair-weights-swapped", "not-rotated",
                              "last-frame-skipped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@torch.no_grad()
def test_planted_defects_exceed_the_tolerance(request, monkeypatch, dtype, plant):
    monkeypatch.setattr(rk, "_run", plant(rk._run))
    assert error(request, dtype, SHAPES[0]) > PLANTED_FACTOR * RELATIVE_TOLERANCE[dtype]


@torch.no_grad()
def test_bf16_under_the_interpreter_falls_back_with_its_reason():
    inputs = memory_inputs(0, SHAPES[2], torch.bfloat16)
    torch.testing.assert_close(rotated_keys(*inputs), rotated_keys_reference(*inputs))
    assert fallback_counts() == {"dtype bfloat16 not supported by the Triton interpreter": 1}


@torch.no_grad()
def test_widths_the_kernel_cannot_tile_take_the_reference_and_count_it():
    inputs = memory_inputs(0, (1, 2, 4, 24, 32), torch.float32)  # mem_dim 24: no power of 2
    torch.testing.assert_close(rotated_keys(*inputs), rotated_keys_reference(*inputs))
    assert fallback_counts() == {"input channels or output pairs not powers of 2 >= 16": 1}


def test_keys_that_are_not_whole_frames_are_refused_with_the_shapes():
    x, weight, bias, rotations = memory_inputs(0, SHAPES[2], torch.float32)
    with pytest.raises(ValueError, match=r"\(3, 71, 16\)"):
        rotated_keys(x[:, :-1], weight, bias, rotations)


@pytest.mark.parametrize("split", [False, True], ids=["one-call", "split-by-frame"])
@torch.no_grad()
def test_memory_cross_attention_on_the_kernel_equals_the_module_path(monkeypatch, split):
    """The seeded nano's memory cross-attention (16 x 16 queries, 3 memory frames, 8 pointer tokens, the
    padding masked) with its keys on the kernel, against the module path, fp32: in one attention call,
    and split by memory frame (the sdpa switch's path on a GPU, patched in on the CPU)."""
    monkeypatch.setattr(importlib.import_module("samfast.sam2.memory.attention"), "splits_by_memory_frame",
                        lambda device: split)
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32")
    attention = model.memory_attention.layers[1].cross_attn_image
    attention.split_by_memory_frame = split
    g = torch.Generator().manual_seed(1)
    queries, memory = torch.randn(2, 256, 256, generator=g), torch.randn(2, 3 * 256 + 8, 64, generator=g)
    key_mask = torch.ones(2, 3 * 256 + 8, dtype=torch.bool)
    key_mask[1, 2 * 256:3 * 256] = False  # the second object's third frame slot is padding
    rotations = model.memory_attention.rotations(256, torch.device("cpu"))
    want = attention(queries, memory, memory, rotations, num_k_exclude_rope=8, key_mask=key_mask)
    attention.key_impl = "triton"
    got = attention(queries, memory, memory, rotations, num_k_exclude_rope=8, key_mask=key_mask)
    assert fallback_counts() == {}, "the kernel did not run"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
