"""The heads the compile switch compiles for a propagated frame (SAM2Tracking._propagation_heads), run
uncompiled on the CPU: the multimask outputs left out, everything tracking keeps equal to the full heads'.
Seeded sam2.1_hiera_nano at a 256 input (16 x 16 features), 3 objects."""

from __future__ import annotations

import pytest
import torch

from parity.tasks.video.produce import at_input_size
from samfast.sam2.build import build_sam2_model

OBJECTS, SIDE = 3, 16


@pytest.fixture(scope="module")
def model():
    return at_input_size(build_sam2_model("sam2.1_hiera_nano", device="cpu"), 16 * SIDE)


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
