"""The memory cross-attention's keys split into chunks (the sdpa switch's split_keys for video).

attention_over_key_splits against F.scaled_dot_product_attention in fp64: masks, keys padded to a
multiple of the chunk count, chunks with no key left; the module path with the split forced on a CPU
(where key_splits gives one chunk), and the switch that turns it on. The CUDA kernels (cuDNN in bf16,
the memory-efficient one in fp32) are compared the same way in tests/gpu/test_video_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import samfast
from samfast.sam2.memory import attention as memory_attention
from samfast.sam2.memory.attention import RoPEAttention, attention_over_key_splits, key_splits
from samfast.sam2.memory.rope import axial_rotations


def _inputs(batch: int, heads: int, queries: int, keys: int, dtype=torch.float64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, 16, generator=generator, dtype=dtype) for n in (queries, keys, keys))
    return q, k, v


@pytest.mark.parametrize(("batch", "heads", "keys", "splits"), [(1, 1, 48, 4), (2, 1, 50, 3), (3, 2, 31, 2), (1, 1, 9, 8)])
def test_equals_one_call_in_fp64(batch, heads, keys, splits):
    """Any key count (padded to a multiple of the chunks), any mask that leaves a query a key."""
    q, k, v = _inputs(batch, heads, 12, keys)
    mask = torch.rand(batch, keys, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[:, 0] = True
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
    torch.testing.assert_close(attention_over_key_splits(q, k, v, mask, splits), reference, rtol=0, atol=1e-12)


def test_a_chunk_of_masked_keys_has_no_weight():
    """The fixed-capacity memory early in a video: only its first slots filled, so whole chunks are
    padding. The CPU kernel returns a log-sum-exp of 0 for them (not -inf): without the explicit
    empty-chunk weight this merge would average in zeros."""
    q, k, v = _inputs(2, 1, 8, 64)
    mask = torch.zeros(2, 64, dtype=torch.bool)
    mask[:, :10] = True  # chunks 2-4 of 4 hold no key
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
    torch.testing.assert_close(attention_over_key_splits(q, k, v, mask, 4), reference, rtol=0, atol=1e-12)


def test_every_chunk_is_aligned_for_the_kernels(monkeypatch):
    """CUDA's memory-efficient kernel refuses a bias whose rows are not 16-byte aligned (fp32: 4 keys;
    found on an H100 with 130 keys a chunk): every chunk holds a multiple of CHUNK_ALIGN keys."""
    seen = []
    real = memory_attention._attention_and_lse
    monkeypatch.setattr(memory_attention, "_attention_and_lse", lambda q, k, v, bias: seen.append(k.shape[-2]) or real(q, k, v, bias))
    q, k, v = _inputs(1, 1, 8, 130 * 4 - 3)
    reference = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(attention_over_key_splits(q, k, v, None, 4), reference, rtol=0, atol=1e-12)
    assert seen == [136]  # 517 keys padded to 544: 4 chunks of 136


def test_without_a_mask_every_key_counts():
    q, k, v = _inputs(1, 1, 8, 40)
    torch.testing.assert_close(attention_over_key_splits(q, k, v, None, 4), F.scaled_dot_product_attention(q, k, v),
                               rtol=0, atol=1e-12)


def test_chunk_counts():
    """One object on a GPU: 4 chunks (measured fastest); more objects (one compiled graph for them all)
    and CPUs: one call."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [key_splits(n, cuda) for n in (1, 2, 3, 4, 8)] == [4, 1, 1, 1, 1]
    assert key_splits(1, cpu) == 1


def test_cross_attention_module_with_split_keys(monkeypatch):
    """RoPEAttention's split path (forced to 3 chunks on a CPU) equals its one call: rotations, the
    object-pointer keys left unrotated and the padding mask as the tracker passes them."""
    torch.manual_seed(0)
    module = RoPEAttention(32, num_heads=1, dropout=0.0, kv_in_dim=8, rope_k_repeat=True).eval()
    side, frames, pointers = 4, 3, 4
    tgt = torch.randn(2, side * side, 32)
    memory = torch.randn(2, frames * side * side + pointers, 8)
    mask = torch.ones(2, memory.shape[1], dtype=torch.bool)
    mask[1, side * side : 3 * side * side] = False  # object 2: two padded memory frames
    freqs = axial_rotations(32, side, side)
    with torch.no_grad():
        one_call = module(tgt, memory, memory, freqs, pointers, mask)
        module.split_keys = True
        assert torch.equal(module(tgt, memory, memory, freqs, pointers, mask), one_call)  # a CPU: one chunk
        monkeypatch.setattr(memory_attention, "key_splits", lambda sequences, device: 3)
        calls = []
        monkeypatch.setattr(memory_attention, "attention_over_key_splits",
                            lambda *args: calls.append(args[-1]) or attention_over_key_splits(*args))
        split = module(tgt, memory, memory, freqs, pointers, mask)
    assert calls == [3]  # the split path ran, with the chunk count key_splits gave
    torch.testing.assert_close(split, one_call, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("stages", "split"), [("fp32", False), ("fp32+sdpa", True), ("bf16+sdpa", True)])
def test_the_sdpa_switch_splits_the_cross_attention_keys(stages, split):
    """build_sam_video's sdpa switch: every layer's memory cross-attention, never the self-attention."""
    predictor = samfast.build_sam_video("sam2.1_hiera_nano", device="cpu", stages=stages)
    layers = predictor.model.memory_attention.layers
    assert [layer.cross_attn_image.split_keys for layer in layers] == [split] * len(layers)
    assert not any(layer.self_attn.split_keys for layer in layers)
