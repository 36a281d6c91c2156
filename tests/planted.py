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


def perturb_decoder(model, scale: float, seed: int):
    """Add seeded Gaussian noise of `scale` x each parameter's spread to the mask decoder (SAM 1's or SAM 2's);
    returns the model. The spread is the population std (correction=0): SAM 2's decoder has one-element
    parameters, whose sample std is NaN."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.prompt_decoder().parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale * param.std(correction=0).clamp_min(1e-3))
    return model
