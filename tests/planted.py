"""Planted defects shared by the GPU sync tests: the checker must see what these add."""

from __future__ import annotations


def item_sync_in_decoder(model):
    """Make the mask decoder's forward call .item() (a host-device sync) on every call; returns the model."""
    decoder_forward = model.mask_decoder.forward

    def forward_with_item(*args, **kwargs):
        masks, iou = decoder_forward(*args, **kwargs)
        iou.max().item()  # the defect
        return masks, iou

    model.mask_decoder.forward = forward_with_item
    return model
