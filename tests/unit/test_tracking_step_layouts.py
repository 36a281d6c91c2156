"""What the compile switch changes in a tracked frame's step besides compiling it, on the CPU without compiling:
the memory encoder's convolutions channels_last at every batch (MemoryEncoder.compile_static), and a
propagated frame's heads without the multimask outputs (SAM2Tracking._propagation_heads); both leave the
values as they were. Seeded sam2.1_hiera_nano at a 256 input (16 x 16 features), 3 objects."""

from __future__ import annotations

import pytest
import torch

from parity.tasks.video.track import at_input_size
from samfast.sam2.build import build_sam2_model

OBJECTS, SIDE = 3, 16


@pytest.fixture(scope="module")
def model():
    return at_input_size(build_sam2_model("sam2.1_hiera_nano", device="cpu"), 16 * SIDE)


def test_memory_encoder_runs_and_returns_channels_last_at_any_batch(model, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    pix_feat = torch.randn(OBJECTS, 256, SIDE, SIDE, generator=gen)
    masks = torch.randn(OBJECTS, 1, 16 * SIDE, 16 * SIDE, generator=gen)
    encoder = model.memory_encoder
    before = encoder.encode(pix_feat, masks, True)["vision_features"]
    monkeypatch.setattr("samfast.sam2.memory.encoder.compile_per_object_count", lambda fn, mode, dims: fn)
    encoder.compile_static("default")
    convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(conv.weight.is_contiguous(memory_format=torch.channels_last) for conv in convs)
    after = encoder(pix_feat, masks, skip_mask_sigmoid=True)["vision_features"]
    assert after.is_contiguous(memory_format=torch.channels_last) and not before.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_propagation_heads_keep_the_best_mask_only(model):
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(OBJECTS, 256, SIDE, SIDE, generator=gen)
    high_res = [torch.randn(OBJECTS, 32, 4 * SIDE, 4 * SIDE, generator=gen),
                torch.randn(OBJECTS, 64, 2 * SIDE, 2 * SIDE, generator=gen)]
    full = model._sam_heads(features, None, None, high_res, multimask_output=True)
    kept = model._propagation_heads(features, *high_res, True)
    assert kept[:2] == (None, None) and len(kept) == len(full)
    assert full[1].shape[1] == 3  # what the heads no longer hand out: three full-resolution masks an object
    for name, ours, theirs in zip(("ious", "low-res mask", "high-res mask", "object pointer", "object score"),
                                  kept[2:], full[2:]):
        assert torch.equal(ours, theirs), name
