"""SAM 3 as a family of the house: build_sam("sam3", ...) reads sam3.pt through the family record (its key
mapping, its strict check, its seeded weights in sam3.pt's layout), refuses every wrong source with the
fix, and sam3's own builder name runs on it. The model's equality with sam3 is test_sam3_image_model.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import samfast
from samfast.checkpoint import CheckpointError
from samfast.errors import StageError
from samfast.families import family_of, family_of_state_dict
from samfast.sam3 import Sam3Processor, build_sam3_image_model
from samfast.sam3 import checkpoint as sam3_checkpoint
from samfast.sam3.checkpoint import DETECTOR_PREFIX, SAM2_NECK_PREFIX, TRACKER_PREFIX, model_layout, synthetic_state_dict
from samfast.sam3.config import SAM3_IMAGE, SAM3_REDUCED, build_image_model
from samfast.sam3.vit import Attention
from tests.sam3_reference import read_layouts

REDUCED = "sam3_reduced"


@pytest.fixture(scope="module")
def seeded() -> dict[str, torch.Tensor]:
    return synthetic_state_dict(REDUCED, seed=0)


@pytest.mark.parametrize("interactive", [False, True])
def test_seeded_weights_are_sam3_pts_layout_and_load_strictly(seeded, interactive):
    """The detector's keys, and the tracker's that predict_inst reads: a model built with or without
    enable_inst_interactivity takes what it holds of them."""
    assert family_of_state_dict(seeded) is family_of("sam3")
    tracker = {key.split(".")[1] for key in seeded if key.startswith(TRACKER_PREFIX)}
    assert tracker == {"sam_prompt_encoder", "sam_mask_decoder", "no_mem_embed"}
    assert all(key.startswith((DETECTOR_PREFIX, TRACKER_PREFIX)) for key in seeded)
    model = samfast.build_sam(REDUCED, seed=0, device="cpu", enable_inst_interactivity=interactive)
    state = model.state_dict()
    mapped = model_layout(seeded, {k: v.shape for k, v in state.items()})
    assert state.keys() == mapped.keys() and all(torch.equal(state[k], mapped[k]) for k in state)
    assert any(k.startswith("inst_interactive_predictor.") for k in state) == interactive
    assert all(torch.isfinite(t).all() for t in seeded.values() if not t.is_complex())
    # the ViT's RoPE tables are computed, as a checkpoint holds them, not drawn
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            assert torch.equal(state[f"{name}.freqs_cis"], module.rope_table()), name


def test_seeded_weights_are_a_function_of_the_seed(seeded):
    again, other = synthetic_state_dict(REDUCED, seed=0), synthetic_state_dict(REDUCED, seed=1)
    assert all(torch.equal(seeded[k], again[k]) for k in seeded)
    drawn = [k for k in seeded if not k.endswith("freqs_cis")]
    assert all(not torch.equal(seeded[k], other[k]) for k in drawn)


def test_a_phrase_reaches_the_outputs_of_a_seeded_model():
    model = samfast.build_sam(REDUCED, seed=0, device="cpu")
    processor = Sam3Processor(model, resolution=SAM3_REDUCED.image_size, device="cpu", confidence_threshold=0.0)
    image = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    state = processor.set_image(image)
    red = processor.set_text_prompt("a red circle", state)["scores"].clone()
    blue = processor.set_text_prompt("blue squares", state)["scores"]
    assert red.shape == (SAM3_REDUCED.num_queries,) and torch.isfinite(red).all()
    assert not torch.equal(red, blue)


def test_a_sam3_pt_file_loads_unchanged(seeded, tmp_path):
    path = tmp_path / "sam3.pt"
    torch.save({"model": seeded}, path)
    model = samfast.build_sam(REDUCED, path, device="cpu")
    assert all(torch.equal(v, model_layout(seeded)[k]) for k, v in model.state_dict().items())


def test_the_trackers_keys_and_the_second_neck_are_left_to_the_tracker(seeded):
    """sam3.pt holds the tracker and the neck's SAM 2 branch, which the image model without
    interactivity does not build: they are dropped, as sam3's loader drops them."""
    extra = {"tracker.maskmem_tpos_enc": torch.zeros(7, 1, 1, 64),
             DETECTOR_PREFIX + SAM2_NECK_PREFIX + "0.weight": torch.zeros(1)}
    samfast.build_sam(REDUCED, {**seeded, **extra}, device="cpu")


def _without(state: dict, key: str) -> dict:
    return {k: v for k, v in state.items() if k != key}


@pytest.mark.parametrize("source, model_type, match", [
    (None, REDUCED, r"seeded weights need seed=N \(e.g. build_sam\('sam3_reduced', seed=0\)\), or pass the path of sam3.pt"),
    ("vit_tiny", REDUCED, r"this is a SAM 1 checkpoint, not a SAM 3 one: use model type 'vit_tiny'"),
    ("sam2.1_hiera_nano", REDUCED, r"this is a SAM 2 checkpoint, not a SAM 3 one: use model type 'sam2.1_hiera_nano'"),
    (REDUCED, "vit_tiny", r"this is a SAM 3 checkpoint \(sam3_reduced\), not a SAM 1 one"),
    (REDUCED, "sam3", r"this checkpoint is sam3_reduced; you asked for sam3. Call build_sam\('sam3_reduced'"),
    ("missing", REDUCED, r"checkpoint does not fit sam3_reduced: missing keys \(1\): backbone.vision_backbone.trunk.pos_embed"),
    ("unexpected", REDUCED, r"unexpected keys \(1\): backbone.extra"),
    ("image layout", REDUCED, r"in the image model's own layout .* save it as sam3.pt does"),
], ids=["no-seed", "sam1-file", "sam2-file", "sam3-file-as-sam1", "other-size", "missing-key", "unexpected-key",
        "image-layout"])
def test_every_wrong_source_is_refused_with_the_fix(seeded, source, model_type, match):
    if source in ("vit_tiny", "sam2.1_hiera_nano", REDUCED):
        checkpoint = samfast.synthetic_state_dict(source, 0)
    elif source == "missing":
        checkpoint = _without(seeded, DETECTOR_PREFIX + "backbone.vision_backbone.trunk.pos_embed")
    elif source == "unexpected":
        checkpoint = {**seeded, DETECTOR_PREFIX + "backbone.extra": torch.zeros(1)}
    elif source == "image layout":
        checkpoint = model_layout(seeded)
    else:
        checkpoint = None
    with pytest.raises(CheckpointError, match=match):
        samfast.build_sam(model_type, checkpoint, device="cpu")


def test_sam1_and_sam2_keep_seed_0_by_default():
    model = samfast.build_sam("vit_b_2block", device="cpu")
    seeded = samfast.synthetic_state_dict("vit_b_2block", 0)
    assert all(torch.equal(model.state_dict()[k], seeded[k]) for k in seeded)


def test_unbuilt_switches_are_refused_before_building():
    with pytest.raises(StageError, match=r"the triton, nt switch\(es\) are not built for SAM 3 yet; sam3 takes fp32 "
                                         r"and any combination of bf16, compile, sdpa, int8, fp8: use 'bf16\+compile\+sdpa'"):
        samfast.build_sam("sam3", seed=0, stages="nt")


def test_a_saved_buffer_of_no_known_kind_is_refused(monkeypatch):
    """The planted defect: a new persistent buffer would otherwise be drawn as noise or left out."""
    def with_a_buffer(config, tokenizer=None, enable_inst_interactivity=False):
        model = build_image_model(config, tokenizer, enable_inst_interactivity)
        model.transformer.register_buffer("table", torch.zeros(3))
        return model

    monkeypatch.setattr(sam3_checkpoint, "build_image_model", with_a_buffer)
    with pytest.raises(TypeError, match=r"detector.transformer.table: a saved buffer"):
        synthetic_state_dict(REDUCED, 0)


def test_the_full_size_model_reads_sam3_pts_layout():
    """At SAM 3's real sizes (built on the meta device): the keys and shapes the family's mapping gives
    of the recorded sam3.pt layout are the image model's."""
    recorded = read_layouts()["sam3.pt"]
    with torch.device("meta"):
        model = build_image_model(SAM3_IMAGE, tokenizer=lambda phrases: None)
    official = {k: torch.empty(shape, dtype=getattr(torch, dtype), device="meta") for k, (shape, dtype) in recorded.items()}
    mapped = model_layout(official)
    assert {k: v.shape for k, v in mapped.items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert family_of("sam3").infer_model_type(official)[0] == "sam3"


@pytest.mark.parametrize("kwargs, error, match", [
    ({}, CheckpointError, r"load_from_HF=True would download sam3.pt .* samfast downloads nothing"),
    ({"load_from_HF": False}, CheckpointError, r"no checkpoint_path was given: .* seeded weights need seed=N"),
    ({"seed": 0, "enable_segmentation": False}, NotImplementedError, r"enable_segmentation=False: not built on samfast"),
], ids=["hub", "no-checkpoint", "no-segmentation"])
def test_sam3s_builder_refuses_what_samfast_does_not_do(kwargs, error, match):
    with pytest.raises(error, match=match):
        build_sam3_image_model(device="cpu", **kwargs)


def test_sam3s_builder_loads_the_file_as_build_sam_does(seeded, tmp_path, monkeypatch):
    path = tmp_path / "sam3.pt"
    torch.save(seeded, path)
    # sam3's builder is the official model; the file here is the reduced one, built the same way
    monkeypatch.setattr(sam3_checkpoint, "MODEL_TYPE", REDUCED)
    monkeypatch.setattr("samfast.sam3.builder.MODEL_TYPE", REDUCED)
    model = build_sam3_image_model(device="cpu", checkpoint_path=str(path))
    assert not model.training
    assert all(torch.equal(v, model_layout(seeded)[k]) for k, v in model.state_dict().items())
    # sam3's own numerics: fp32, attention through SDPA; compile=True adds samfast's compile switch
    assert model.switches == {"sdpa"} and {m.attn_impl for m in model.attention_modules().values()} == {"sdpa"}
    compiled = build_sam3_image_model(device="cpu", checkpoint_path=str(path), compile=True)
    assert compiled.switches == {"sdpa", "compile"} and compiled.compiled_grounding is not None
    # enable_inst_interactivity: the tracker's heads from the same file, for predict_inst
    interactive = build_sam3_image_model(device="cpu", checkpoint_path=str(path), enable_inst_interactivity=True)
    state = interactive.state_dict()
    assert interactive.inst_interactive_predictor is not None and model.inst_interactive_predictor is None
    assert all(torch.equal(v, model_layout(seeded, state)[k]) for k, v in state.items())
