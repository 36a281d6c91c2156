"""sam3.pt read into the image model's layout: the mapping is sam3's own loader's, the check is strict,
and every wrong file gets a message naming the fix. No model is built: the layouts come from
tests/fixtures/sam3_layouts.json (checked against sam3's models in test_sam3_reference.py), the tensors
are zero-strided views of one element, so a full-size state dict costs nothing to make or save."""

from __future__ import annotations

import math

import pytest
import torch

from samfast.checkpoint import CheckpointError
from samfast.sam3.checkpoint import (
    INTERACTIVE_PREFIX,
    SAM2_NECK_PREFIX,
    TRACKER_VIDEO_PARTS,
    image_state_dict,
    read_sam3_checkpoint,
)
from tests.sam3_reference import import_model_builder, read_layouts, samfast_image_layout

DTYPES = {"float32": torch.float32, "complex64": torch.complex64}


@pytest.fixture(scope="module")
def layouts():
    return read_layouts()


def _state(layout) -> dict[str, torch.Tensor]:
    """A state dict of `layout`'s keys, shapes and dtypes, each tensor one element expanded to its shape."""
    return {key: torch.ones((), dtype=DTYPES[dtype]).expand(shape) for key, (shape, dtype) in layout.items()}


def _shapes(layout) -> dict[str, torch.Size]:
    return {key: torch.Size(shape) for key, (shape, _) in layout.items()}


@pytest.fixture(scope="module")
def official(layouts):
    return _state(layouts["sam3.pt"])


class _Capture:
    """What sam3.model_builder._load_checkpoint touches of a model: the interactive predictor (whether
    there is one) and load_state_dict, which records what it is given."""

    def __init__(self, interactive: bool):
        self.inst_interactive_predictor = object() if interactive else None

    def load_state_dict(self, state, strict):
        self.loaded, self.strict = state, strict
        return [], []


@pytest.mark.parametrize("interactive", [False, True])
def test_mapping_is_sam3_loaders(official, layouts, tmp_path, interactive):
    """sam3's loader and ours map the same file to the same keys and tensors; without interactivity sam3
    keeps the neck's second branch, which its model then ignores (strict=False) and ours leaves out; with
    it, sam3 keeps the tracker's video parts, which its predictor holds and never runs for images, and ours
    leaves out (TRACKER_VIDEO_PARTS)."""
    path = tmp_path / "sam3.pt"
    tiny = {key: torch.tensor(float(i)) for i, key in enumerate(official)}  # values tell the keys apart
    torch.save({"model": tiny}, path)
    capture = _Capture(interactive)
    import_model_builder()._load_checkpoint(capture, str(path))
    ours = image_state_dict(tiny, enable_inst_interactivity=interactive)
    theirs = capture.loaded
    left_out = {k for k in theirs if k not in ours}
    if interactive:
        parts = {k[len(INTERACTIVE_PREFIX):].split(".")[0] for k in left_out if k.startswith(INTERACTIVE_PREFIX)}
        assert parts == TRACKER_VIDEO_PARTS and len(left_out) == 160
    else:
        assert left_out == {k for k in theirs if k.startswith(SAM2_NECK_PREFIX)} != set()
    theirs = {k: v for k, v in theirs.items() if k in ours}
    assert capture.strict is False and ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert set(ours) == set(samfast_image_layout(layouts, interactive))


@pytest.mark.parametrize("interactive", [False, True])
@pytest.mark.parametrize("wrapped", [False, True])
def test_full_layout_file_reads_strictly(official, layouts, tmp_path, interactive, wrapped):
    """The full sam3.pt layout, at the top level or under "model", fits the image model's own layout."""
    path = tmp_path / "sam3.pt"
    torch.save({"model": official} if wrapped else official, path)
    image = samfast_image_layout(layouts, interactive)
    state = read_sam3_checkpoint(path, _shapes(image), enable_inst_interactivity=interactive)
    assert {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state.items()} == image
    assert sum(v.numel() for v in state.values()) == sum(math.prod(shape) for shape, _ in image.values())


def test_missing_unexpected_and_misshapen_keys_in_one_error(official, layouts):
    state = dict(official)
    del state["detector.backbone.language_backbone.encoder.positional_embedding"]
    del state["detector.transformer.decoder.presence_token.weight"]
    state["detector.extra.weight"] = torch.zeros(1)
    state["stray_top_level"] = torch.zeros(1)
    state["detector.dot_prod_scoring.prompt_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError) as err:
        read_sam3_checkpoint(state, _shapes(layouts["image"]))
    message = str(err.value)
    assert message.startswith("checkpoint does not fit sam3 (enable_inst_interactivity=False): missing keys (2): ")
    for key in ["backbone.language_backbone.encoder.positional_embedding", "transformer.decoder.presence_token.weight",
                "unexpected keys (2): extra.weight, stray_top_level",
                "dot_prod_scoring.prompt_proj.weight: checkpoint (3, 3) vs model (256, 256)"]:
        assert key in message


def test_tracker_keys_needed_with_interactivity(official, layouts):
    detector_only = {k: v for k, v in official.items() if k.startswith("detector.")}
    read_sam3_checkpoint(detector_only, _shapes(layouts["image"]))  # the image model alone needs no tracker
    assert sum(k.startswith("tracker.") for k in official) == 309
    # the 149 of the heads (prompt encoder, mask decoder, no_mem_embed); not the 160 of video's parts
    with pytest.raises(CheckpointError, match=r"missing keys \(149\): inst_interactive_predictor\.model\."):
        read_sam3_checkpoint(detector_only, _shapes(samfast_image_layout(layouts, True)), enable_inst_interactivity=True)


def test_an_unknown_tracker_key_is_unexpected_with_interactivity(official, layouts):
    """A tracker key of no part samfast knows (neither the heads nor TRACKER_VIDEO_PARTS) is named."""
    state = {**official, "tracker.new_part.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=r"unexpected keys \(1\): inst_interactive_predictor\.model\.new_part\.weight"):
        read_sam3_checkpoint(state, _shapes(samfast_image_layout(layouts, True)), enable_inst_interactivity=True)


def _sam1_vit_b() -> dict[str, torch.Tensor]:
    state = {"image_encoder.patch_embed.proj.weight": torch.zeros(()).expand(768, 3, 16, 16)}
    state.update({f"image_encoder.blocks.{i}.norm1.weight": torch.zeros(1) for i in range(12)})
    return state


def _sam2_1_tiny() -> dict[str, torch.Tensor]:
    state = {"image_encoder.trunk.patch_embed.proj.weight": torch.zeros(()).expand(96, 3, 7, 7)}
    state.update({f"image_encoder.trunk.blocks.{i}.norm1.weight": torch.zeros(1) for i in range(12)})
    state["no_obj_embed_spatial"] = torch.zeros(1, 64)
    return state


@pytest.mark.parametrize("family, found, make", [("SAM 1", "vit_b", _sam1_vit_b), ("SAM 2", "sam2.1_hiera_t", _sam2_1_tiny)])
def test_other_family_names_its_model_type(layouts, tmp_path, family, found, make):
    path = tmp_path / "other.pt"
    torch.save({"model": make()}, path)
    with pytest.raises(CheckpointError, match=rf"this is a {family} checkpoint, not a SAM 3 one: use model type "
                       rf"'{found}' \(build_sam\('{found}', checkpoint=\.\.\.\)\); for sam3, pass the path of sam3\.pt"):
        read_sam3_checkpoint(path, _shapes(layouts["image"]))


def test_other_family_of_unknown_size(layouts):
    state = _sam1_vit_b()
    state["image_encoder.blocks.12.norm1.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"a SAM 1 checkpoint, not a SAM 3 one: it is of no SAM 1 model type"):
        read_sam3_checkpoint(state, _shapes(layouts["image"]))


def test_image_layout_and_foreign_dicts_refused(official, layouts):
    image_layout = image_state_dict(official)
    with pytest.raises(CheckpointError, match=r"in the image model's own layout .* every key of the image model under "
                       r"'detector\.'"):
        read_sam3_checkpoint(image_layout, _shapes(layouts["image"]))
    with pytest.raises(CheckpointError, match=r"holds no SAM 3 detector \(no 'detector\.backbone\.vision_backbone\."
                       r"trunk\.patch_embed\.proj\.weight' key\): pass the path of sam3\.pt"):
        read_sam3_checkpoint({"conv.weight": torch.zeros(1)}, _shapes(layouts["image"]))


def test_unreadable_files(layouts, tmp_path):
    expected = _shapes(layouts["image"])
    with pytest.raises(CheckpointError, match=r"checkpoint not found: .*sam3\.pt\. Pass the path of .* or sam3\.pt"):
        read_sam3_checkpoint(tmp_path / "sam3.pt", expected)
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"not a zip archive")
    with pytest.raises(CheckpointError, match=r"damaged\.pt \(17 bytes\) is not a readable PyTorch checkpoint"):
        read_sam3_checkpoint(damaged, expected)
    a_list = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], a_list)
    with pytest.raises(CheckpointError, match=r"list\.pt holds a list, not a state dict"):
        read_sam3_checkpoint(a_list, expected)
    with pytest.raises(CheckpointError, match=r"no trained checkpoint ships for sam3"):
        read_sam3_checkpoint("trained", expected)
