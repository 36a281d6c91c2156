"""The mask decoder's upscaling as GEMMs on channels-last tokens (the compile switch) equals the transposed convolutions."""

from __future__ import annotations

import importlib

import pytest
import torch

import samfast
from tests.decoder_inputs import decoder_inputs

mask_upscale = importlib.import_module("samfast.kernels.mask_upscale")


def _decode(model, upscale_impl: str):
    embeddings, pe, sparse, dense, index = decoder_inputs(model, 5, points_per_prompt=2)
    model.mask_decoder.upscale_impl = upscale_impl
    return model.mask_decoder(embeddings, pe, sparse, dense, True, index)


@pytest.fixture(scope="module")
def model():
    return samfast.build_sam("vit_tiny", device="cpu")


def test_upscaling_as_gemm_equals_the_transposed_convolutions(model):
    (want, want_iou), (got, got_iou) = _decode(model, "conv"), _decode(model, "gemm")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_iou, want_iou, rtol=0, atol=0)  # the IoU head does not depend on the upscaling


def test_a_planted_sub_pixel_swap_is_caught(model, monkeypatch):
    """The comparison can fail: the 2x2 block's outputs placed transposed (a and b swapped)."""
    real = mask_upscale._conv_transpose_2x2

    def swapped(x, conv):
        return real(x, conv).unflatten(1, (-1, 2)).unflatten(3, (-1, 2)).transpose(2, 4).flatten(3, 4).flatten(1, 2)

    monkeypatch.setattr(mask_upscale, "_conv_transpose_2x2", swapped)
    want, got = _decode(model, "conv")[0], _decode(model, "gemm")[0]
    assert (got - want).abs().max() > 1e-3
