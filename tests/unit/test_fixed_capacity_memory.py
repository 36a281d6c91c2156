"""The memory at its fixed capacity (samfast.sam2.tracker._at_fixed_capacity, what the video compile switch
reads): one shape for the memory attention whatever the bank holds, padding that takes no part in the
cross-attention (its contents change no bit of the output), and the real memories' result to float rounding,
with the cross-attention in one masked call and split by memory frame (the sdpa switch's: a padded frame is
whole, a slot all padding or all memory).

Seeded sam2.1_hiera_nano's memory attention at a 256 input (16 x 16 tokens a frame) on random features and
memories, two objects in one batch. The bank: a conditioning frame 0, then frames 1..n tracked, as a video
fills it; the step on frame n + 1 reads 1 + min(n, 6) memories and 1 + min(n, 15) object pointers.
"""

from __future__ import annotations

import pytest
import torch

from samfast.sam2 import tracker
from samfast.sam2.memory import attention
from samfast.sam2.build import build_sam2_model
from samfast.video.memory_bank import FrameOutput, MemoryBank

BATCH, SIDE, NUM_FRAMES = 2, 16, 24
CAPACITY = 7 * SIDE * SIDE + 16 * 4  # num_maskmem frames of 16 x 16 tokens, 16 pointers of 4 tokens


@pytest.fixture(scope="module")
def model():
    return build_sam2_model("sam2.1_hiera_nano", device="cpu")


def frame_output(gen: torch.Generator) -> FrameOutput:
    """A stored output as the predictor keeps it: bf16 memory, its positional encoding, a pointer."""
    return FrameOutput(
        pred_masks=torch.zeros(BATCH, 1, 4, 4),
        obj_ptr=torch.randn(BATCH, 256, generator=gen),
        object_score_logits=torch.ones(BATCH, 1),
        maskmem_features=torch.randn(BATCH, 64, SIDE, SIDE, generator=gen).to(torch.bfloat16),
        # the sine encoding of the map's size, one for every object (the predictor expands one copy)
        maskmem_pos_enc=[torch.randn(1, 64, SIDE, SIDE, generator=gen).expand(BATCH, -1, -1, -1)],
    )


@pytest.fixture(scope="module")
def bank() -> MemoryBank:
    gen = torch.Generator().manual_seed(0)
    bank = MemoryBank()
    bank.cond_frame_outputs[0] = frame_output(gen)
    for t in range(1, NUM_FRAMES):
        bank.non_cond_frame_outputs[t] = frame_output(gen)
    return bank


@pytest.fixture(scope="module")
def features() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(SIDE * SIDE, BATCH, 256, generator=gen)], [torch.randn(SIDE * SIDE, BATCH, 256, generator=gen)]


def conditioned(model, bank: MemoryBank, frame_idx: int, features, *, fixed: bool) -> torch.Tensor:
    """The step's memory-conditioned features on frame_idx, reading the bank's frames before it."""
    seen = MemoryBank()
    seen.cond_frame_outputs.update(bank.cond_frame_outputs)
    seen.non_cond_frame_outputs.update((t, out) for t, out in bank.non_cond_frame_outputs.items() if t < frame_idx)
    model.fixed_capacity_memory = fixed
    try:
        with torch.no_grad():
            return model._prepare_memory_conditioned_features(
                frame_idx, False, *features, [(SIDE, SIDE)], seen, num_frames=NUM_FRAMES
            )
    finally:
        model.fixed_capacity_memory = False


def recording_calls(model, bank, features, *, fixed: bool) -> list[tuple]:
    """(memory shape, pointer tokens, key mask) of every memory attention call as frames 1..23 are tracked."""
    calls = []
    attend = model.memory_attention.attend

    def recording(curr, memory, curr_pos, memory_pos, rotations, num_obj_ptr_tokens, memory_mask):
        kept = None if memory_mask is None else memory_mask.clone()  # as it was at this call
        calls.append((tuple(memory.shape), num_obj_ptr_tokens, kept))
        return attend(curr, memory, curr_pos, memory_pos, rotations, num_obj_ptr_tokens, memory_mask)

    model.memory_attention.attend = recording
    try:
        for frame_idx in range(1, NUM_FRAMES):
            conditioned(model, bank, frame_idx, features, fixed=fixed)
    finally:
        del model.memory_attention.attend
    return calls


@pytest.fixture(scope="module")
def fixed_calls(model, bank, features) -> list[tuple]:
    """The padded steps' calls, recorded once: the two tests below read the same 23 steps, tracked once."""
    return recording_calls(model, bank, features, fixed=True)


@pytest.fixture(params=[False, True], ids=["one-call", "by-frame"])
def split(request, model, monkeypatch):
    """The cross-attentions in one masked call, or split by memory frame (the sdpa switch's GPU path, here on the CPU)."""
    monkeypatch.setattr(attention, "splits_by_memory_frame", lambda device: True)
    layers = model.memory_attention.layers
    for layer in layers:
        layer.cross_attn_image.split_by_memory_frame = request.param
    yield request.param
    for layer in layers:
        layer.cross_attn_image.split_by_memory_frame = False


def test_padding_fills_whole_frame_slots(fixed_calls):
    """What attention_by_memory_frame relies on: each frame slot of the key mask is all memory or all padding."""
    assert len(fixed_calls) == NUM_FRAMES - 1
    for _, _, mask in fixed_calls:
        slots = mask[:, : 7 * SIDE * SIDE].reshape(BATCH, 7, SIDE * SIDE)
        assert torch.equal(slots.all(dim=-1), slots.any(dim=-1))


def test_the_memory_attention_sees_one_shape_as_the_bank_fills(model, bank, features, fixed_calls):
    assert {shape for shape, _, _ in fixed_calls} == {(CAPACITY, BATCH, 64)}
    assert {ptr_tokens for _, ptr_tokens, _ in fixed_calls} == {16 * 4}
    # the real tokens: the conditioning frame and up to 6 recent ones, a pointer per frame read, up to 16
    real = [(1 + min(t - 1, 6)) * SIDE * SIDE + min(t, 16) * 4 for t in range(1, NUM_FRAMES)]
    assert [mask.sum(dim=1).tolist() for _, _, mask in fixed_calls] == [[n] * BATCH for n in real]
    # what the padding replaces: sam2's memory grows over the first 16 frames
    unpadded = recording_calls(model, bank, features, fixed=False)
    assert [shape for shape, _, _ in unpadded] == [(n, BATCH, 64) for n in real]


@pytest.mark.parametrize("frame_idx", [1, 3, 8, 20])
def test_padding_contents_change_no_bit(model, bank, features, monkeypatch, frame_idx, split):
    """The padded slots filled with random tokens instead of zeros: the same features, bit for bit (the key
    mask takes them out of the softmax; rotating them and projecting them touches no real token)."""
    zeros = conditioned(model, bank, frame_idx, features, fixed=True)
    gen = torch.Generator().manual_seed(2)

    def noise(like, count):
        return torch.randn(like.shape[0], count, like.shape[2], generator=gen).to(like.dtype)

    monkeypatch.setattr(tracker, "_zeros", noise)
    assert torch.equal(conditioned(model, bank, frame_idx, features, fixed=True), zeros)


@pytest.mark.parametrize("frame_idx", [1, 3, 7, 20])
def test_padded_memory_equals_sams_to_rounding(model, bank, features, frame_idx, split):
    """The real slots keep sam2's order, rotations (the pointer tokens unrotated) and temporal encodings:
    the padded step gives the unpadded one's features to fp32 rounding. Measured over frames 1..23 (CPU,
    torch 2.14.1): at most 2.9e-6 at values up to 4.3 (a few ulps: the softmax and the weighted sum add
    the same terms in other groupings), bit-equal on frames 4, 8, 12 and from 16 on (there every slot is real)."""
    padded = conditioned(model, bank, frame_idx, features, fixed=True)
    unpadded = conditioned(model, bank, frame_idx, features, fixed=False)
    torch.testing.assert_close(padded, unpadded, rtol=0, atol=1e-5)
    if frame_idx >= 16:
        assert torch.equal(padded, unpadded)
