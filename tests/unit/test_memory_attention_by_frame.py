"""The memory cross-attention split at its memory frames (the sdpa switch's split_by_memory_frame for video).

attention_by_memory_frame against F.scaled_dot_product_attention in fp64: padded frame slots, pointer
tokens partly or wholly padded, no pointers, no mask, values narrower than the queries; the module
path (its value projection folded into the output projection) against its one call; and the switch
that turns it on. The CUDA kernels (cuDNN in bf16, the memory-efficient one in fp32) are compared
the same way in tests/gpu/test_video_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import samfast
from samfast.sam2.memory import attention as memory_attention
from samfast.sam2.memory.attention import RoPEAttention, attention_by_memory_frame
from samfast.modeling.rope import axial_rotations

QUERIES = 12  # tokens of a frame: the queries' and each memory frame's


def _inputs(batch: int, heads: int, frames: int, pointers: int, value_width: int = 16, seed: int = 0):
    """q, k of 16 channels, v of value_width (narrower: the folded value projection's memory channels)."""
    generator = torch.Generator().manual_seed(seed)
    keys = frames * QUERIES + pointers
    return tuple(torch.randn(batch, heads, n, width, generator=generator, dtype=torch.float64)
                 for n, width in ((QUERIES, 16), (keys, 16), (keys, value_width)))


def _mask(batch: int, frames: int, pointers: int, real_frames: list[int], real_pointers: list[int]) -> torch.Tensor:
    """(batch, keys): object i's first real_frames[i] frames and first real_pointers[i] pointer tokens."""
    mask = torch.zeros(batch, frames * QUERIES + pointers, dtype=torch.bool)
    for i, (f, p) in enumerate(zip(real_frames, real_pointers, strict=True)):
        mask[i, : f * QUERIES] = True
        mask[i, frames * QUERIES : frames * QUERIES + p] = True
    return mask


def split_attention(q, k, v, mask, pointers):
    """attention_by_memory_frame of keys given as one tensor, its last `pointers` tokens the pointers."""
    frames = k.shape[-2] - pointers
    return attention_by_memory_frame(q, k[:, :, :frames], k[:, :, frames:], v, mask)


def _reference(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None, None, :])


@pytest.mark.parametrize(
    ("batch", "heads", "frames", "pointers", "real_frames", "real_pointers", "value_width"),
    [
        (1, 1, 7, 16, [7], [16], 16),  # a full memory
        (1, 1, 7, 16, [1], [4], 16),  # the first tracked frame: only the prompted frame and its pointer
        (3, 1, 3, 8, [3, 1, 2], [8, 0, 5], 16),  # objects at different fills; one without a pointer yet
        (2, 2, 2, 0, [2, 1], [0, 0], 16),  # no pointer tokens at all; two heads
        (1, 1, 3, 8, [2], [4], 4),  # values narrower than the queries (the folded value projection)
        (3, 1, 3, 8, [3, 1, 2], [8, 0, 5], 4),
    ],
)
def test_equals_one_masked_call_in_fp64(batch, heads, frames, pointers, real_frames, real_pointers, value_width):
    """Padded slots and pointer tokens take no part: a padded slot's own attention (over its zero
    keys) gets no weight. Planted defect below: with every slot counted the result differs."""
    q, k, v = _inputs(batch, heads, frames, pointers, value_width)
    mask = _mask(batch, frames, pointers, real_frames, real_pointers)
    torch.testing.assert_close(split_attention(q, k, v, mask, pointers), _reference(q, k, v, mask),
                               rtol=0, atol=1e-12)


def test_without_a_mask_every_key_counts():
    q, k, v = _inputs(2, 1, 3, 4)
    torch.testing.assert_close(split_attention(q, k, v, None, 4), _reference(q, k, v, None), rtol=0, atol=1e-12)


def test_planted_defect_padded_slots_counted_differ():
    """The check above can fail: a memory whose padded slots are read as real (the mask dropped for the
    frames) is not the masked attention."""
    q, k, v = _inputs(1, 1, 4, 4)
    mask = _mask(1, 4, 4, [1], [4])
    frames_in = mask.clone()
    frames_in[:, : 4 * QUERIES] = True
    assert not torch.allclose(split_attention(q, k, v, frames_in, 4), _reference(q, k, v, mask), atol=1e-3)


def test_keys_that_are_not_whole_frames_are_refused():
    q, k, v = _inputs(1, 1, 2, 3)
    with pytest.raises(ValueError, match="not whole frames"):
        split_attention(q, k, v, None, 2)


def test_one_object_s_frames_go_to_the_kernel_as_one_batch(monkeypatch):
    """One object: its frames as one batch of sequences of a frame's length, unmasked (one sequence alone
    leaves most of a GPU idle), then its pointer tokens in a call of their own, the padded ones biased out."""
    seen = []
    real = memory_attention._attention_and_lse
    monkeypatch.setattr(memory_attention, "_attention_and_lse",
                        lambda q, k, v, bias=None: seen.append((tuple(k.shape), bias)) or real(q, k, v, bias))
    q, k, v = _inputs(1, 1, 5, 8)
    split_attention(q, k, v, _mask(1, 5, 8, [2], [4]), 8)
    assert [shape for shape, _ in seen] == [(5, 1, QUERIES, 16), (1, 1, 8, 16)]
    frames_bias, pointers_bias = (bias for _, bias in seen)
    assert frames_bias is None
    expected = torch.tensor([0.0] * 4 + [memory_attention.PADDED_KEY_BIAS] * 4, dtype=q.dtype)
    assert pointers_bias.shape == (1, 1, QUERIES, 8) and torch.equal(pointers_bias[0, 0], expected.expand(QUERIES, 8))


def test_several_objects_take_one_call_per_frame_slot_reading_the_queries_in_place(monkeypatch):
    """Several objects: one unmasked call per frame slot over every object, each given the queries
    themselves (no copy per frame) and its slot's keys and values as views of the memory's."""
    calls = []
    real = memory_attention._attention_and_lse
    monkeypatch.setattr(memory_attention, "_attention_and_lse", lambda q, k, v, bias=None: calls.append((q, k, v)) or real(q, k, v, bias))
    q, k, v = _inputs(3, 1, 5, 8)
    split_attention(q, k, v, _mask(3, 5, 8, [5, 2, 1], [8, 8, 4]), 8)
    assert [tuple(key.shape) for _, key, _ in calls] == [(3, 1, QUERIES, 16)] * 5 + [(3, 1, 8, 16)]  # then the pointers
    assert all(queries is q for queries, _, _ in calls)
    assert all(key.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() for _, key, _ in calls)
    assert [key.storage_offset() for _, key, _ in calls[:5]] == [f * QUERIES * 16 for f in range(5)]


def test_on_a_cpu_the_switch_keeps_one_call():
    """fp32+sdpa stays bit-equal to sam2 on a CPU (tests/unit/test_sam2_video.py): the split runs on GPUs."""
    assert memory_attention.splits_by_memory_frame(torch.device("cuda"))
    assert not memory_attention.splits_by_memory_frame(torch.device("cpu"))


def test_cross_attention_module_split_by_memory_frame(monkeypatch):
    """RoPEAttention's split path equals its one call: rotations, the object-pointer keys left unrotated,
    the padding mask as the tracker passes them, and the value projection folded into the output's (the
    attention weighs the memory's 8 channels; v_proj never runs)."""
    torch.manual_seed(0)
    module = RoPEAttention(32, num_heads=1, dropout=0.0, kv_in_dim=8, rope_k_repeat=True).eval()
    side, frames, pointers = 4, 3, 4
    tgt = torch.randn(2, side * side, 32)
    memory = torch.randn(2, frames * side * side + pointers, 8)
    mask = torch.ones(2, memory.shape[1], dtype=torch.bool)
    mask[1, side * side : 3 * side * side] = False  # object 2: two padded memory frames
    mask[1, -1] = False  # and a padded pointer token
    freqs = axial_rotations(32, side, side)
    monkeypatch.setattr(memory_attention, "splits_by_memory_frame", lambda device: True)  # a GPU's path, on the CPU
    value_widths = []
    real = memory_attention._attention_and_lse
    monkeypatch.setattr(memory_attention, "_attention_and_lse",
                        lambda q, k, v, bias=None: value_widths.append(v.shape[-1]) or real(q, k, v, bias))
    with torch.no_grad():
        one_call = module(tgt, memory, memory, freqs, pointers, mask)
        module.split_by_memory_frame = True
        module.v_proj.register_forward_hook(lambda *_: pytest.fail("the value projection ran: it is folded"))
        split = module(tgt, memory, memory, freqs, pointers, mask)
    assert value_widths == [8] * (frames + 1)  # frames, then pointers: the memory's own channels, not 32 projected ones
    assert not torch.equal(split, one_call)  # another kernel ran (rounding differs) ...
    torch.testing.assert_close(split, one_call, rtol=0, atol=1e-5)  # ... to the same attention


@pytest.mark.parametrize(("stages", "split"), [("fp32", False), ("fp32+sdpa", True), ("bf16+sdpa", True)])
def test_the_sdpa_switch_splits_the_cross_attention_by_memory_frame(stages, split):
    """build_sam_video's sdpa switch: every layer's memory cross-attention, never the self-attention."""
    predictor = samfast.build_sam_video("sam2.1_hiera_nano", device="cpu", stages=stages)
    layers = predictor.model.memory_attention.layers
    assert [layer.cross_attn_image.split_by_memory_frame for layer in layers] == [split] * len(layers)
    assert not any(layer.self_attn.split_by_memory_frame for layer in layers)
