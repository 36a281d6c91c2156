"""SAM 3's video tracker is SAM 2.1's memory machinery at SAM 3's sizes (docs/sam3-video.md): samfast's
MemoryAttention and MemoryEncoder, given sam3.pt's tracker weights under their SAM 2 names, equal sam3
0.1.4's `transformer.encoder` and `maskmem_backbone` in fp32 on the CPU.

sam3's tracker as its builder makes it (full width, 1008 px), under sam3's own seeded initialisation;
the memory attention at a 24 x 24 grid (it takes any square grid: RoPE is recomputed per size), the
encoder at the 72 x 72 grid its 1152-pixel mask input gives."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")

from samfast.sam2.memory.attention import MemoryAttention  # noqa: E402
from samfast.sam2.memory.encoder import MemoryEncoder  # noqa: E402
from tests.sam3_reference import import_model_builder, leave_tracker_autocast, on_cpu  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)
# The encoders run the same modules in the same order on the same inputs: bitwise equal. The antialiasing of
# the resize moves the memory by ~1e-6 only, under TOL, so nothing looser would see it go.
EXACT = dict(rtol=0, atol=0)
# sam3.pt's tracker prefixes -> samfast's SAM 2 module names (the rest of the tracker's keys are the same)
RENAMED = {"transformer.encoder.": "memory_attention", "maskmem_backbone.": "memory_encoder"}
MASK_INPUT_SIZE = (1152, 1152)  # sam3's SimpleMaskDownSampler interpol_size: 1152 / 16 = the 72 x 72 grid


@pytest.fixture(scope="module")
def tracker():
    torch.manual_seed(0)
    with on_cpu():
        tracker = import_model_builder().build_tracker(apply_temporal_disambiguation=False)
    leave_tracker_autocast(tracker)
    return tracker.eval()


def loaded(module: torch.nn.Module, tracker: torch.nn.Module, prefix: str) -> torch.nn.Module:
    """`module` with the tracker's weights under `prefix`, loaded strictly."""
    state = {key[len(prefix):]: value for key, value in tracker.state_dict().items() if key.startswith(prefix)}
    module.load_state_dict(state, strict=True)
    return module.eval()


def test_memory_attention_equals_sam3s(tracker):
    ours = loaded(MemoryAttention(256, 4, 64), tracker, "transformer.encoder.")
    side, batch, pointers = 24, 2, 8
    generator = torch.Generator().manual_seed(1)
    current, current_pos = (torch.randn(side * side, batch, 256, generator=generator) for _ in range(2))
    # two memory frames of the grid, then the object pointers' tokens (4 per 256-wide pointer at width 64)
    memory, memory_pos = (torch.randn(2 * side * side + pointers, batch, 64, generator=generator) for _ in range(2))
    with torch.no_grad():
        want = tracker.transformer.encoder(src=[current], src_key_padding_mask=[None], src_pos=[current_pos],
                                           prompt=memory, prompt_pos=memory_pos, feat_sizes=[(side, side)],
                                           num_obj_ptr_tokens=pointers)["memory"]
        got = ours(curr=[current], curr_pos=[current_pos], memory=memory, memory_pos=memory_pos,
                   num_obj_ptr_tokens=pointers)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("mask_side", [1008, 1152])
def test_memory_encoder_with_sam3s_mask_size_equals_sam3s(tracker, mask_side):
    """A 1008-pixel mask (the tracker's image size) is resized to 1152 first; a 1152 one goes straight in."""
    ours = loaded(MemoryEncoder(64, 256, interpol_size=MASK_INPUT_SIZE), tracker, "maskmem_backbone.")
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(2, 256, 72, 72, generator=generator)
    masks = 5 * torch.randn(2, 1, mask_side, mask_side, generator=generator)
    with torch.no_grad():
        want = tracker.maskmem_backbone(features, masks, skip_mask_sigmoid=False)
        got = ours(features, masks)
    torch.testing.assert_close(got["vision_features"], want["vision_features"], **EXACT)
    torch.testing.assert_close(got["vision_pos_enc"][0], want["vision_pos_enc"][0], **EXACT)


def test_without_the_resize_the_encoder_differs(tracker):
    """The planted defect: resizing without antialiasing (what a plain bilinear resize does) gives another
    memory."""
    ours = loaded(MemoryEncoder(64, 256), tracker, "maskmem_backbone.")
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(1, 256, 72, 72, generator=generator)
    masks = 5 * torch.randn(1, 1, 1008, 1008, generator=generator)
    plain = torch.nn.functional.interpolate(masks, size=MASK_INPUT_SIZE, mode="bilinear", align_corners=False)
    with torch.no_grad():
        want = tracker.maskmem_backbone(features, masks)["vision_features"]
        got = ours(features, plain)["vision_features"]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got, want, **EXACT)


def test_the_tracker_holds_only_sam2s_keys_once_two_prefixes_are_renamed(tracker):
    """Every tracker key but the image encoder's has its SAM 2 counterpart: the memory modules under the
    two renamed prefixes, the rest (heads, pointers, embeddings) under the same names."""
    from samfast.sam2.config import sam2_config
    from samfast.sam2.sam2_base import build_sam2_modules

    with torch.device("meta"):
        sam2 = build_sam2_modules(sam2_config("sam2.1_hiera_t"))
    want = {key for key in sam2.state_dict() if not key.startswith("image_encoder.")}
    got = set()
    for key in tracker.state_dict():
        for prefix, name in RENAMED.items():
            if key.startswith(prefix):
                key = f"{name}.{key[len(prefix):]}"
        got.add(key.replace(".mlp.lin1.", ".mlp.layers.0.").replace(".mlp.lin2.", ".mlp.layers.1."))
    assert got == want
