"""Seeded inputs for a SAM 2 model's mask decoder over two images, as tests/decoder_inputs.py makes SAM 1's."""

from __future__ import annotations

import torch


def sam2_decoder_inputs(model, prompts: int, *, mask_inputs: bool = False):
    """(image embeddings (2, C, h, w), image_pe, sparse, dense, [stride-4, stride-8 levels], image_index).

    Prompt p reads image p % 2; two foreground points each, uniform over the input; the
    high-resolution levels as the decoder reads them (after conv_s0 / conv_s1). Seeded with 0.
    """
    encoder, decoder = model.sam_prompt_encoder, model.sam_mask_decoder
    h, w = encoder.image_embedding_size
    c = decoder.transformer_dim
    torch.manual_seed(0)
    embeddings = torch.randn(2, c, h, w)
    high_res = [torch.randn(2, c // 8, 4 * h, 4 * w), torch.randn(2, c // 4, 2 * h, 2 * w)]
    masks = torch.randn(prompts, 1, 4 * h, 4 * w) if mask_inputs else None
    coords = torch.rand(prompts, 2, 2) * model.image_size
    labels = torch.ones(prompts, 2, dtype=torch.int)
    sparse, dense = encoder(points=(coords, labels), boxes=None, masks=masks)
    index = torch.arange(prompts) % 2
    return embeddings, encoder.get_dense_pe(), sparse, dense, high_res, index
