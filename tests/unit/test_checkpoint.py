"""Checkpoint loading: synthetic weights are deterministic; every bad file gets a message naming the fix."""

from __future__ import annotations

import pytest
import torch

import samfast
from samfast import CheckpointError


def test_synthetic_state_dict_is_deterministic_and_seeded():
    a = samfast.synthetic_state_dict("vit_tiny", seed=0)
    b = samfast.synthetic_state_dict("vit_tiny", seed=0)
    c = samfast.synthetic_state_dict("vit_tiny", seed=1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["image_encoder.blocks.0.attn.qkv.weight"], c["image_encoder.blocks.0.attn.qkv.weight"])
    # rel-pos tables must be non-zero, or the decomposed bias (and the Triton kernel) is never exercised
    assert a["image_encoder.blocks.1.attn.rel_pos_h"].abs().mean() > 0.01


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found: .*nope.pth.*sam_vit_"):
        samfast.build_sam("vit_tiny", checkpoint=tmp_path / "nope.pth")


def test_truncated_file(tmp_path):
    path = tmp_path / "sam_vit_tiny.pth"
    torch.save(samfast.synthetic_state_dict("vit_tiny"), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint.*truncated"):
        samfast.build_sam("vit_tiny", checkpoint=path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.pth"
    path.write_text("these are not weights")
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint"):
        samfast.build_sam("vit_tiny", checkpoint=path)
    torch.save({"weights": torch.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="holds no SAM state dict"):
        samfast.build_sam("vit_tiny", checkpoint=path)


def test_pickled_code_is_refused(tmp_path):
    """weights_only=True: a checkpoint that would run code on load is refused, not executed."""
    path = tmp_path / "evil.pth"
    torch.save({"image_encoder.patch_embed.proj.weight": torch.zeros(1), "x": object()}, path)
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint"):
        samfast.build_sam("vit_tiny", checkpoint=path)


def test_wrong_model_type_names_both(tmp_path):
    path = tmp_path / "sam_vit_tiny.pth"
    torch.save(samfast.synthetic_state_dict("vit_tiny"), path)
    with pytest.raises(CheckpointError, match=r"this checkpoint is vit_tiny \(embed dim 128\); you asked for vit_b"):
        samfast.build_sam("vit_b", checkpoint=path)


def test_wrong_model_type_vit_h_header_only(tmp_path):
    """The model-type check runs before any weight is used: a vit_h header is enough to be refused."""
    state = samfast.synthetic_state_dict("vit_tiny")
    state["image_encoder.patch_embed.proj.weight"] = torch.zeros(1280, 3, 16, 16)
    state.update({f"image_encoder.blocks.{i}.norm1.weight": torch.zeros(1) for i in range(32)})
    path = tmp_path / "sam_vit_h.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"this checkpoint is vit_h \(embed dim 1280\); you asked for vit_tiny"):
        samfast.build_sam("vit_tiny", checkpoint=path)


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    state = samfast.synthetic_state_dict("vit_tiny")
    del state["mask_decoder.iou_token.weight"]
    state["mask_decoder.extra_head.weight"] = torch.zeros(2)
    path = tmp_path / "edited.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as err:
        samfast.build_sam("vit_tiny", checkpoint=path)
    message = str(err.value)
    assert "missing keys (1): mask_decoder.iou_token.weight" in message
    assert "unexpected keys (1): mask_decoder.extra_head.weight" in message


def test_wrapped_training_checkpoint_loads(tmp_path):
    path = tmp_path / "train.pth"
    torch.save({"model": samfast.synthetic_state_dict("vit_tiny", seed=2), "step": 10}, path)
    model = samfast.build_sam("vit_tiny", checkpoint=path, device="cpu")
    assert torch.equal(
        model.mask_decoder.iou_token.weight, samfast.synthetic_state_dict("vit_tiny", seed=2)["mask_decoder.iou_token.weight"]
    )


def test_unknown_model_type():
    with pytest.raises(ValueError, match="unknown model type 'vit_x'; choose one of vit_h, vit_l, vit_b, vit_tiny"):
        samfast.build_sam("vit_x")
