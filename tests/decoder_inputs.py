"""Seeded inputs for a model's mask decoder over two images, as the decoder tests feed it."""

from __future__ import annotations

import torch


def decoder_inputs(model, prompts: int, *, points_per_prompt: int = 1, mask_inputs: bool = False, dtype=torch.float32):
    """(image embeddings (2, 256, 64, 64), image_pe, sparse, dense, image_index) for `prompts` point prompts.

    Prompt p reads image p % 2; points are uniform over the 1024 x 1024 input, all foreground;
    with mask_inputs each prompt has a random low-res mask input (the decoder's per-prompt path).
    Seeded with 0, so equal calls give equal inputs.
    """
    device = model.device
    torch.manual_seed(0)
    embeddings = torch.randn(2, 256, 64, 64, device=device, dtype=dtype)
    masks = torch.randn(prompts, 1, 256, 256, device=device) if mask_inputs else None
    coords = torch.rand(prompts, points_per_prompt, 2, device=device) * 1024
    labels = torch.ones(prompts, points_per_prompt, dtype=torch.int, device=device)
    sparse, dense = model.prompt_encoder(points=(coords, labels), boxes=None, masks=masks)
    index = torch.arange(prompts, device=device) % 2
    return embeddings, model.prompt_encoder.get_dense_pe(), sparse, dense, index
