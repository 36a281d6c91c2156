"""The mask decoder's upscaling as GEMMs on channels-last tokens (the compile switch) equals the transposed convolutions."""

from __future__ import annotations

import importlib

import pytest
import torch

import samfast
from tests.decoder_inputs import decoder_inputs
from tests.sam2_decoder_inputs import sam2_decoder_inputs

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


# --- SAM 2: the high-resolution levels added between the convolutions -----------------------------


@pytest.fixture(scope="module")
def sam2_model():
    return samfast.build_sam("sam2.1_hiera_nano", device="cpu")


def _decode_sam2(model, upscale_impl: str):
    embeddings, pe, sparse, dense, high_res, index = sam2_decoder_inputs(model, 5)
    model.sam_mask_decoder.upscale_impl = upscale_impl
    with torch.no_grad():
        return model.sam_mask_decoder.predict_masks(embeddings, pe, sparse, dense, False, high_res, index)


def test_sam2_upscaling_as_gemm_equals_the_transposed_convolutions(sam2_model):
    """Prompts of two images: each prompt's own image's high-resolution levels enter its upscaling."""
    want, got = _decode_sam2(sam2_model, "conv"), _decode_sam2(sam2_model, "gemm")
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1:], want[1:], strict=True):  # IoUs, tokens, object scores: before the upscaling
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_sam2_gemm_upscaling_without_its_high_res_levels_is_caught(sam2_model, monkeypatch):
    """The comparison can fail: the GEMM path planted to drop the high-resolution levels."""
    real = mask_upscale.upscaled_masks_reference
    monkeypatch.setattr(samfast.kernels, "upscaled_masks_reference", lambda src, up, hyper, high_res: real(src, up, hyper))
    want, got = _decode_sam2(sam2_model, "conv")[0], _decode_sam2(sam2_model, "gemm")[0]
    assert (got - want).abs().max() > 1e-2
