"""The memory encoder's depthwise convolutions as sums of shifted copies (samfast.sam2.memory.encoder.
depthwise_conv_as_sums, what its compile_static switches on): equal to the convolution in fp64 math, and the
whole encoder to float rounding of its uncompiled self, at several batches. A tap read from the wrong shift
or channel (a planted defect) fails."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from samfast.sam2.memory import encoder as encoder_module
from samfast.sam2.memory.encoder import MemoryEncoder, depthwise_conv_as_sums


@pytest.fixture
def conv() -> nn.Conv2d:
    torch.manual_seed(0)
    return nn.Conv2d(8, 8, kernel_size=7, padding=3, groups=8).double()


@pytest.mark.parametrize("batch", [1, 3])
def test_equals_the_depthwise_convolution_in_fp64(conv, batch):
    x = torch.randn(batch, 8, 12, 10, dtype=torch.float64)
    torch.testing.assert_close(depthwise_conv_as_sums(x, conv), conv(x), rtol=1e-12, atol=1e-12)


def test_a_tap_from_the_wrong_place_is_caught(conv):
    x = torch.randn(2, 8, 12, 10, dtype=torch.float64)
    flipped = nn.Conv2d(8, 8, kernel_size=7, padding=3, groups=8).double()
    flipped.load_state_dict({"weight": conv.weight.flip(-1), "bias": conv.bias})  # every row's taps mirrored
    assert not torch.allclose(depthwise_conv_as_sums(x, flipped), conv(x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("batch", [1, 2])
def test_the_encoder_with_its_compile_switch_equals_itself_without(batch, monkeypatch):
    torch.manual_seed(1)
    encoder = MemoryEncoder(out_dim=64).eval()
    pix_feat, masks = torch.randn(batch, 256, 16, 16), torch.randn(batch, 1, 256, 256)
    before = encoder(pix_feat, masks)["vision_features"]
    monkeypatch.setattr(encoder_module, "compile_per_object_count", lambda fn, mode, dims: fn)  # uncompiled
    encoder.compile_static("default")
    assert all(block.depthwise_as_sums for block in encoder.fuser.layers)
    torch.testing.assert_close(encoder(pix_feat, masks)["vision_features"], before, rtol=1e-5, atol=1e-5)
