"""The mask decoder projects an image's tokens once for all its prompts, and that changes no number.

When every prompt has the same dense embedding (no mask input: the broadcast no-mask embedding),
the first two-way layer's image-side projections run once per image and are gathered to the
prompts (samfast/modeling/transformer.py). A dense embedding per prompt (mask inputs) takes the
per-prompt path; giving the no-mask embedding as a per-prompt copy does the same, so the two paths
can be compared on identical inputs.
"""

from __future__ import annotations

import pytest
import torch

import samfast
from tests.sam2_decoder_inputs import sam2_decoder_inputs


@pytest.fixture(scope="module")
def decoder_inputs():
    torch.manual_seed(0)
    sam = samfast.build_sam("vit_tiny", device="cpu")
    images, prompts = 3, 7
    embeddings = torch.randn(images, 256, 64, 64)
    points = torch.rand(prompts, 2, 2) * 1024
    labels = torch.tensor([[1, 0]] * prompts, dtype=torch.int)
    sparse, dense = sam.prompt_encoder(points=(points, labels), boxes=None, masks=None)
    assert dense.stride(0) == 0  # the broadcast no-mask embedding: the shared path
    image_index = torch.tensor([2, 0, 0, 1, 2, 2, 1])
    return sam.mask_decoder, embeddings, sam.prompt_encoder.get_dense_pe(), sparse, dense, image_index


def _decode(decoder, embeddings, image_pe, sparse, dense, image_index):
    with torch.no_grad():
        return decoder.predict_masks(embeddings, image_pe, sparse, dense, image_index)


@pytest.mark.parametrize("image_index", ["several images", "one image"])
def test_image_projected_once_equals_a_copy_per_prompt(decoder_inputs, image_index):
    decoder, embeddings, image_pe, sparse, dense, index = decoder_inputs
    if image_index == "one image":
        embeddings, index = embeddings[:1], None
    shared = _decode(decoder, embeddings, image_pe, sparse, dense, index)
    per_prompt = _decode(decoder, embeddings, image_pe, sparse, dense.contiguous(), index)
    for got, want in zip(shared, per_prompt, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_comparison_tells_the_images_apart(decoder_inputs):
    """It can fail: prompts gathered from the wrong images (a shuffled index) give other masks."""
    decoder, embeddings, image_pe, sparse, dense, index = decoder_inputs
    shuffled = _decode(decoder, embeddings, image_pe, sparse, dense, index.roll(1))
    per_prompt = _decode(decoder, embeddings, image_pe, sparse, dense.contiguous(), index)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(shuffled[0], per_prompt[0], rtol=1e-4, atol=1e-4)


def test_sam2_image_projected_once_equals_a_copy_per_prompt():
    """SAM 2's decoder takes the same shared path when its prompts come with image_index (nt, the compiled
    decoder, segment everything); its high-resolution levels are gathered to the prompts either way."""
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu")
    embeddings, image_pe, sparse, dense, high_res, index = sam2_decoder_inputs(model, 7)
    assert dense.stride(0) == 0
    decoder = model.sam_mask_decoder
    with torch.no_grad():
        shared = decoder.predict_masks(embeddings, image_pe, sparse, dense, False, high_res, index)
        per_prompt = decoder.predict_masks(embeddings, image_pe, sparse, dense.contiguous(), False, high_res, index)
        shuffled = decoder.predict_masks(embeddings, image_pe, sparse, dense, False, high_res, index.roll(1))
    for got, want in zip(shared, per_prompt, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError):  # the comparison tells the images apart
        torch.testing.assert_close(shuffled[0], per_prompt[0], rtol=1e-4, atol=1e-4)
