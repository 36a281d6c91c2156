"""SAM 2 checkpoints through samfast.build_sam: official layouts load, every wrong file gets a message naming the fix."""

from __future__ import annotations

import pytest
import torch

import samfast
from samfast import CheckpointError, StageError
from samfast.sam2.build import build_sam2
from samfast.sam2.checkpoint import synthetic_state_dict
from samfast.sam2.config import model_type_of_config_file

TINY = "sam2.1_hiera_t"


@pytest.fixture(scope="module")
def tiny_state():
    return synthetic_state_dict(TINY, seed=0)


@pytest.fixture(scope="module")
def tiny_file(tiny_state, tmp_path_factory):
    """An official-layout file: {"model": state_dict}."""
    path = tmp_path_factory.mktemp("sam2") / "sam2.1_hiera_tiny.pt"
    torch.save({"model": tiny_state}, path)
    return path


def test_synthetic_weights_are_deterministic_per_seed(tiny_state):
    again = synthetic_state_dict(TINY, seed=0)
    other = synthetic_state_dict(TINY, seed=1)
    assert len(tiny_state) == 471  # as sam2's build_sam2 of sam2.1_hiera_t.yaml
    assert all(torch.equal(tiny_state[k], again[k]) for k in tiny_state)
    assert not torch.equal(tiny_state["no_mem_embed"], other["no_mem_embed"])


def test_official_file_and_dict_layouts_load(tiny_state, tiny_file):
    from_file = samfast.build_sam(TINY, tiny_file, device="cpu")
    from_dict = samfast.build_sam(TINY, {"model": tiny_state}, device="cpu")
    for key, value in from_file.state_dict().items():
        assert torch.equal(value, tiny_state[key]) and torch.equal(from_dict.state_dict()[key], value), key
    assert not from_file.training


def test_sam1_checkpoint_given_a_sam2_type(tmp_path):
    path = tmp_path / "sam_vit_tiny.pth"
    torch.save(samfast.synthetic_state_dict("vit_tiny"), path)
    with pytest.raises(CheckpointError, match=r"SAM 1 checkpoint \(vit_tiny\), not a SAM 2 one; you asked for "
                       r"sam2.1_hiera_t\. Call build_sam\('vit_tiny'.*sam2.1_hiera_tiny.pt"):
        samfast.build_sam(TINY, path, device="cpu")


def test_sam2_checkpoint_given_a_sam1_type(tiny_file):
    with pytest.raises(CheckpointError, match=r"SAM 2 checkpoint \(sam2.1_hiera_t\), not a SAM 1 one; you asked for "
                       r"vit_b\. Call build_sam\('sam2.1_hiera_t'"):
        samfast.build_sam("vit_b", tiny_file, device="cpu")


def _trunk_only(embed_dim: int, depth: int, sam2_1: bool) -> dict[str, torch.Tensor]:
    """The keys a checkpoint's size is read from (a real large file is 900 MB)."""
    state = {"image_encoder.trunk.patch_embed.proj.weight": torch.zeros(embed_dim, 3, 7, 7)}
    state.update({f"image_encoder.trunk.blocks.{i}.norm1.weight": torch.zeros(1) for i in range(depth)})
    if sam2_1:
        state["no_obj_embed_spatial"] = torch.zeros(1, 64)
    return state


@pytest.mark.parametrize(
    "found, embed_dim, depth, sam2_1",
    [("sam2.1_hiera_l", 144, 48, True), ("sam2.1_hiera_b+", 112, 24, True), ("sam2.1_hiera_s", 96, 16, True)],
)
def test_wrong_size_names_the_size_it_looks_like(tmp_path, found, embed_dim, depth, sam2_1):
    path = tmp_path / "wrong.pt"
    torch.save({"model": _trunk_only(embed_dim, depth, sam2_1)}, path)
    with pytest.raises(CheckpointError, match=rf"this checkpoint is {found.replace('+', '[+]')}; you asked for "
                       rf"sam2.1_hiera_t\. Call build_sam\('{found.replace('+', '[+]')}'"):
        samfast.build_sam(TINY, path, device="cpu")


def test_sam2_0_checkpoint_given_a_sam2_1_type(tiny_state):
    """2.0 files lack 2.1's no-object embedding and temporal projection: told apart, not a key list."""
    v2_0 = {k: v for k, v in tiny_state.items() if k != "no_obj_embed_spatial" and not k.startswith("obj_ptr_tpos_proj")}
    with pytest.raises(CheckpointError, match=r"this checkpoint is sam2_hiera_t; you asked for sam2.1_hiera_t"):
        samfast.build_sam(TINY, v2_0, device="cpu")


def test_unknown_size_and_missing_keys(tiny_state):
    with pytest.raises(CheckpointError, match=r"unknown SAM 2 model \(trunk embed dim 64, 3 blocks\).*sam2.1_hiera_tiny.pt"):
        samfast.build_sam(TINY, _trunk_only(64, 3, True), device="cpu")
    partial = {k: v for k, v in tiny_state.items() if k != "sam_mask_decoder.obj_score_token.weight"}
    with pytest.raises(CheckpointError, match=r"missing keys \(1\): sam_mask_decoder.obj_score_token.weight"):
        samfast.build_sam(TINY, partial, device="cpu")


def test_truncated_file(tiny_file, tmp_path):
    path = tmp_path / "cut.pt"
    path.write_bytes(tiny_file.read_bytes()[: tiny_file.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"not a readable PyTorch checkpoint.*truncated.*sam2.1_hiera_tiny 156 MB"):
        samfast.build_sam(TINY, path, device="cpu")


def test_switches_not_built_for_sam2_are_refused_by_name():
    with pytest.raises(StageError, match=r"the sparse switch\(es\) are not built for SAM 2 yet"):
        samfast.build_sam(TINY, stages="bf16+sparse", device="cpu")
    with pytest.raises(StageError, match="unknown stage"):  # the shared parser still names bad stages
        samfast.build_sam(TINY, stages="warp", device="cpu")


def test_build_sam2_takes_sam2_config_names():
    for name in ("configs/sam2.1/sam2.1_hiera_t.yaml", "sam2.1_hiera_t.yaml", "sam2.1_hiera_t"):
        assert model_type_of_config_file(name) == TINY
    assert model_type_of_config_file("configs/sam2/sam2_hiera_b+.yaml") == "sam2_hiera_b+"
    assert model_type_of_config_file("sam2_hiera_l.yaml") == "sam2_hiera_l"  # sam2's legacy top-level names
    with pytest.raises(ValueError, match="unknown SAM 2 config 'configs/sam2.1/sam2.1_hiera_x.yaml'"):
        model_type_of_config_file("configs/sam2.1/sam2.1_hiera_x.yaml")
    model = build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", device="cpu", apply_postprocessing=False)
    assert not model.training and not model.sam_mask_decoder.dynamic_multimask_via_stability
