"""The SAM 3 reference harness (tests/sam3_reference.py) works: sam3 0.1.4's full-size image model builds
on the CPU with true fp32 settings, its weights are seeded and finite, its layouts are the fixture's, and
each device shim and side-effect guard is still needed (so each goes when sam3 fixes its line). A text
prompt through it, end to end, is test_sam3_image_model.py's full-size test."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import SimpleNamespace

import pytest
import torch

from samfast.checkpoint import key_generator
from samfast.sam3.checkpoint import read_sam3_checkpoint
from tests.sam3_reference import (
    TEXT_ENCODER_EMPTY,
    TorchWith,
    build_reference_image_model,
    import_model_builder,
    layout,
    leave_tracker_autocast,
    official_state_dict,
    on_cpu,
    read_layouts,
    samfast_image_layout,
)

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="with a CUDA device sam3's device lines run as shipped")
NO_DEVICE = (RuntimeError, AssertionError)  # torch's "no NVIDIA driver" / "not compiled with CUDA enabled"


def _tf32() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.mark.slow(reason="builds sam3's full-size image model with its interactive predictor (860M weights, 10-20 s)")
def test_full_size_model_builds_seeded_on_the_cpu():
    tf32_before = _tf32()
    model = build_reference_image_model(seed=0, enable_inst_interactivity=True)
    assert _tf32() == tf32_before and not torch.is_autocast_enabled("cuda")
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    state = model.state_dict()
    assert {t.device.type for t in state.values()} == {"cpu"}
    assert all(torch.isfinite(t).all() for t in state.values()), "a parameter or buffer is not finite"
    for key in TEXT_ENCODER_EMPTY:  # torch.empty in sam3: must hold the seeded values, not stale memory
        seeded = torch.randn(state[key].shape, generator=key_generator(0, key))
        assert torch.allclose(state[key] / seeded, state[key][0, 0] / seeded[0, 0]), key
    layouts = read_layouts()
    official = official_state_dict(model)
    assert layout(official) == layouts["sam3.pt"], "sam3's layout moved: python -m tests.sam3_reference rewrites the fixture"
    assert layout(state) == layouts["image_interactive"]
    # sam3.pt's layout goes back through samfast's strict reader (for samfast's interactive image model,
    # without the tracker's video parts) into sam3's own model: every key but those parts'
    image = samfast_image_layout(layouts, interactive=True)
    mapped = read_sam3_checkpoint({"model": official}, {k: state[k].shape for k in image}, enable_inst_interactivity=True)
    assert mapped.keys() == image.keys() and all(mapped[k].data_ptr() == state[k].data_ptr() for k in mapped)
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    assert not unexpected and set(missing) == set(state) - set(image) and len(missing) == 160


def _forget_sam3(monkeypatch) -> None:
    """The next import of sam3 is a first one again (sys.modules as it was after the test)."""
    for name in ("sam3", "sam3.model_builder"):
        monkeypatch.delitem(sys.modules, name)


def test_first_sam3_import_leaves_tf32_as_it_was(monkeypatch):
    """With an Ampere-or-later GPU, sam3's first import turns TF32 on; import_model_builder undoes it.
    The plain import is checked too, so this test goes when sam3 stops doing it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(major=9))
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    _forget_sam3(monkeypatch)
    import_model_builder()
    assert _tf32() == (False, False)
    _forget_sam3(monkeypatch)
    importlib.import_module("sam3")
    assert _tf32() == (True, True), "sam3 no longer turns TF32 on at import: import_model_builder's guard can go"


def test_tracker_autocast_is_left(monkeypatch):
    """Sam3TrackerPredictor.__init__ enters autocast for good. Its CUDA autocast does nothing on a CPU,
    so here it enters the CPU's instead, which is on: the same entry, seen and then left."""
    builder = import_model_builder()
    tracking = importlib.import_module("sam3.model.sam3_tracking_predictor")
    monkeypatch.setattr(tracking, "torch", TorchWith(autocast=lambda device_type, dtype: torch.autocast("cpu", dtype=dtype)))
    assert not torch.is_autocast_enabled("cpu")
    with on_cpu():
        tracker = builder.build_tracker(apply_temporal_disambiguation=False)
    try:
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16, (
            "sam3's tracker no longer enters autocast at build: leave_tracker_autocast can go"
        )
    finally:
        leave_tracker_autocast(tracker)
    assert not torch.is_autocast_enabled("cpu")


@NO_CUDA
def test_position_encoding_shim_needed():
    builder = import_model_builder()
    with pytest.raises(NO_DEVICE, match="NVIDIA|CUDA"):
        builder._create_position_encoding(precompute_resolution=1008)
    with on_cpu():
        encoding = builder._create_position_encoding(precompute_resolution=1008)
    uncached = builder._create_position_encoding()  # no precomputing: computes each size when asked
    assert sorted(encoding.cache) == [(31, 31), (63, 63), (126, 126), (252, 252)]
    for size, cached in encoding.cache.items():
        assert cached.device.type == "cpu"
        torch.testing.assert_close(cached, uncached(torch.zeros((1, 1) + size))[0], rtol=0, atol=0)


@NO_CUDA
def test_decoder_coordinates_shim_needed():
    builder = import_model_builder()
    with pytest.raises(NO_DEVICE, match="NVIDIA|CUDA"):
        builder._create_transformer_decoder()
    with on_cpu():
        decoder = builder._create_transformer_decoder()
    coords_h, coords_w = decoder.compilable_cord_cache
    assert decoder.compilable_stored_size == (72, 72)  # 1008 / 14
    torch.testing.assert_close(coords_h, torch.arange(72, dtype=torch.float32) / 72, rtol=0, atol=0)
    torch.testing.assert_close(coords_w, coords_h, rtol=0, atol=0)


@NO_CUDA
def test_box_pin_memory_shim_needed():
    builder = import_model_builder()
    torch.manual_seed(0)
    encoder = builder._create_geometry_encoder().eval()
    boxes = torch.tensor([[[0.5, 0.5, 0.4, 0.3]], [[0.3, 0.6, 0.2, 0.2]]])  # (boxes, batch, cxcywh)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    labels = torch.ones(2, 1, dtype=torch.long)
    feats = torch.randn(1, 256, 12, 12)
    with pytest.raises(NO_DEVICE, match="NVIDIA|CUDA|accelerator"):
        encoder._encode_boxes(boxes, mask, labels, feats)
    with on_cpu(), torch.no_grad():
        embedded, _ = encoder._encode_boxes(boxes, mask, labels, feats)
    assert embedded.shape == (2, 1, 256) and torch.isfinite(embedded).all()


@pytest.mark.skipif(importlib.util.find_spec("skimage") is not None, reason="scikit-image is installed: sam3 uses it")
def test_scikit_image_stand_in_needed():
    """sam3's predict_inst fills holes on a CPU with scikit-image's label: without it (no dependency of
    sam3's) it warns and leaves them; with on_cpu's stand-in it fills a 2 x 2 hole and keeps a 5 x 5 one."""
    from sam3.model.utils.sam1_utils import SAM2Transforms

    transforms = SAM2Transforms(resolution=16, mask_threshold=0.0, max_hole_area=4.0)
    logits = torch.ones(1, 1, 16, 16)
    logits[..., 2:4, 2:4] = -1.0  # a hole of 4 pixels: filled
    logits[..., 8:13, 8:13] = -1.0  # a hole of 25: kept
    with pytest.warns(UserWarning, match="post-processing"):
        unfilled = transforms.postprocess_masks(logits, (16, 16))
    assert (unfilled < 0).sum() == 4 + 25
    with on_cpu():
        filled = transforms.postprocess_masks(logits, (16, 16))
    assert (filled[..., 2:4, 2:4] == 10.0).all() and (filled < 0).sum() == 25
