"""Seeded inputs for a SAM 2 model's mask decoder over two images, as tests/decoder_inputs.py makes SAM 1's."""

from __future__ import annotations

import torch


def sam2_decoder_inputs(model, prompts: int, *, points_per_prompt: int = 2, mask_inputs: bool = False,
                        dtype=torch.float32):
    """(image embeddings (2, C, h, w), image_pe, sparse, dense, [stride-4, stride-8 levels], image_index).

    Prompt p reads image p % 2; `points_per_prompt` foreground points each, uniform over the input; the
    high-resolution levels as the decoder reads them (after conv_s0 / conv_s1), on the model's device in
    `dtype`. Seeded with 0.
    """
    encoder, decoder, device = model.sam_prompt_encoder, model.sam_mask_decoder, model.device
    h, w = encoder.image_embedding_size
    c = decoder.transformer_dim
    torch.manual_seed(0)
    embeddings = torch.randn(2, c, h, w).to(device, dtype)
    high_res = [torch.randn(2, c // 8, 4 * h, 4 * w).to(device, dtype), torch.randn(2, c // 4, 2 * h, 2 * w).to(device, dtype)]
    masks = torch.randn(prompts, 1, 4 * h, 4 * w).to(device) if mask_inputs else None
    coords = (torch.rand(prompts, points_per_prompt, 2) * model.image_size).to(device)
    labels = torch.ones(prompts, points_per_prompt, dtype=torch.int, device=device)
    sparse, dense = encoder(points=(coords, labels), boxes=None, masks=masks)
    index = torch.arange(prompts, device=device) % 2
    return embeddings, encoder.get_dense_pe(), sparse, dense, high_res, index
