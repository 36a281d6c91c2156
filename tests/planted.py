"""Planted defects shared by the GPU sync and stage tests (and their CPU twins) and the gate's tests: the checks
must see what these add."""

from __future__ import annotations

import torch


def item_sync_in_decoder(model):
    """Make the mask decoder's forward (SAM 1's or SAM 2's) call .item() (a host-device sync) on every call;
    returns the model."""
    decoder = model.prompt_decoder()
    decoder_forward = decoder.forward

    def forward_with_item(*args, **kwargs):
        outputs = decoder_forward(*args, **kwargs)  # (masks, iou, ...): the IoU predictions second in both
        outputs[1].max().item()  # the defect
        return outputs

    decoder.forward = forward_with_item
    return model


def global_blocks(model) -> list:
    """The image encoder's global-attention blocks (window size 0); at least one, or the defect below plants nothing."""
    found = [block for block in model.image_encoder.blocks if block.window_size == 0]
    assert found, "the model has no global-attention block to plant the defect in"
    return found


def item_sync_in_global_attention(model):
    """Make only the global-attention blocks' attention call .item() (a host-device sync); windowed blocks
    are untouched. Returns the model."""
    for block in global_blocks(model):
        attention_forward = block.attn.forward

        def global_attention_with_item(x, _forward=attention_forward):
            out = _forward(x)
            out.abs().max().item()  # the defect
            return out

        block.attn.forward = global_attention_with_item
    return model


def relpos_bias_scaled_in_global_blocks(model, factor: float = 0.0):
    """Scale the decomposed rel-pos bias of the global-attention blocks only (their rel_pos_h / rel_pos_w
    tables; the bias is linear in them), windowed blocks untouched: factor 0 is a global path that forgets
    the bias. Returns the model."""
    with torch.no_grad():
        for block in global_blocks(model):
            block.attn.rel_pos_h.mul_(factor)
            block.attn.rel_pos_w.mul_(factor)
    return model


def perturb_parameters(module, scale: float, seed: int):
    """Add seeded Gaussian noise of `scale` x each parameter's spread to `module`'s parameters; returns it. The
    spread is the population std (correction=0): SAM 2's decoder has one-element parameters, whose sample std
    is NaN."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale * param.std(correction=0).clamp_min(1e-3))
    return module


def perturb_decoder(model, scale: float, seed: int):
    """perturb_parameters on the mask decoder (SAM 1's or SAM 2's); returns the model."""
    perturb_parameters(model.prompt_decoder(), scale, seed)
    return model


# --- the video tracker's planted defects (tests/parity/test_video_gate.py on seeded weights,
# test_video_gate_trained.py on the trained nano); each patches through pytest's monkeypatch


def drop_oldest_memory(monkeypatch) -> None:
    """The bank hands the tracker one memory fewer than it holds (the oldest of the recent ones)."""
    from samfast.video.memory_bank import MemoryBank

    recent = MemoryBank.recent_memories
    monkeypatch.setattr(MemoryBank, "recent_memories", lambda self, *a, **k: recent(self, *a, **k)[1:])


def zero_object_pointers(monkeypatch) -> None:
    """The object pointers the memory attention reads are all zeros."""
    from samfast.sam2.tracker import SAM2Tracking

    pointers = SAM2Tracking._object_pointers

    def zeroed(self, *args, **kwargs):
        ptrs, pos = pointers(self, *args, **kwargs)
        return (None if ptrs is None else torch.zeros_like(ptrs)), pos

    monkeypatch.setattr(SAM2Tracking, "_object_pointers", zeroed)


def swap_first_two_clicks(monkeypatch) -> None:
    """Object 1 gets object 2's click (frame and point) and the other way round."""
    from parity.tasks.video import produce

    prompts = produce.prompts

    def swapped(clip):
        found = prompts(clip)
        (a, fa, pa), (b, fb, pb) = found[:2]
        return [(a, fb, pb), (b, fa, pa), *found[2:]]

    monkeypatch.setattr(produce, "prompts", swapped)


def failed_gates(result) -> set[str]:
    """The metrics a check's stage result failed on; it must have failed."""
    assert result.verdict == "fail", result.summary
    return {g.metric for g in result.failures}
