"""tinysam's SAM 2 family (sam2.1_hiera_nano): its frame, training forward, sampler grouping, loss,
a smoke run's checkpoint, and the packaged "trained" checkpoint by model type."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

import samfast.checkpoint as checkpoint_module
from parity.compare.metrics import mask_iou
from parity.golden.scenes import generate_scenes
from samfast import build_sam
from samfast.checkpoint import CheckpointError, resolve_checkpoint
from samfast.sam2.checkpoint import synthetic_state_dict
from samfast.modeling.sam2_prompting.image_predictor import SAM2ImagePredictor
from samfast.modeling.sam2_prompting.transforms import SAM2Transforms
from samfast.transforms import preprocess_shape
from tinysam.configs import SAM2_NANO
from tinysam.data import BatchSampler, DeviceData, build_pool
from tinysam.forward import decode_sam2_prompts, fade_high_res
from tinysam.frames import STRETCHED
from tinysam.loop import TrainingStep, prepare_for_training
from tinysam.optimizer import fade_in_weight, make_optimizer
from tinysam.targets import lowres_target
from tinysam.train import main, parse_args

NANO = SAM2_NANO.model_type


@pytest.fixture(scope="module")
def scene():
    """(image, [object masks]) of one training-like scene (seed 1000: a training seed)."""
    coco, images = generate_scenes(1, seed=1000)
    masks = [mask_utils.decode({"size": a["segmentation"]["size"], "counts": a["segmentation"]["counts"].encode("ascii")})
             .astype(bool) for a in coco["annotations"]]
    return next(iter(images.values())), masks


def test_targets_in_the_stretched_frame_reproduce_the_mask_through_sam2_postprocess(scene):
    """SAM 2 upsamples its 256 x 256 logits straight to the image size (SAM2Transforms.postprocess_masks):
    a target integrated over the stretched frame puts its half-cover crossing on the object's edge."""
    image, masks = scene
    postprocess = SAM2Transforms(1024, 0.0).postprocess_masks

    def through_postprocess(target: np.ndarray) -> np.ndarray:
        logits = (torch.from_numpy(target) - 0.5)[None, None] * 20
        return (postprocess(logits, image.shape[:2])[0, 0] > 0).numpy()

    size = STRETCHED.fit(image)[1]
    ious = [mask_iou(through_postprocess(lowres_target(mask, size)), mask) for mask in masks]
    assert size == (1024, 1024) and min(ious) > 0.9 and np.mean(ious) > 0.97, ious
    # The planted defect: SAM 1's frame (longest side, padded) puts every object in the wrong place.
    sam1 = [mask_iou(through_postprocess(lowres_target(mask, preprocess_shape(*image.shape[:2], 1024))), mask)
            for mask in masks]
    assert np.mean(sam1) < 0.7, sam1


def test_training_forward_equals_the_sam2_predictor(scene):
    """decode_sam2_prompts on the predictor's input image gives SAM2ImagePredictor's logits and IoUs
    for points and boxes decoded together; the pool's stretched uint8 image, normalised, is that
    input to within half a grey level."""
    image, _ = scene
    H, W = image.shape[:2]
    model = build_sam(NANO, seed=0, device="cpu")
    predictor = SAM2ImagePredictor(model)
    predictor.set_image(image)
    points = STRETCHED.to_input_frame(np.array([[100.0, 120.0], [200.0, 50.0]]), (H, W))
    box = STRETCHED.to_input_frame(np.array([[[50.0, 60.0], [220.0, 300.0]]]), (H, W)).reshape(1, 4)
    points, box = torch.tensor(points, dtype=torch.float), torch.tensor(box, dtype=torch.float)
    with torch.no_grad():
        expected = [predictor._predict(p[None, None], torch.ones((1, 1), dtype=torch.int), return_logits=True) for p in points]
        expected.append(predictor._predict(None, None, box, return_logits=True))
        inputs = {"points": torch.cat([points, torch.zeros(1, 2)])[:, None],
                  "boxes": torch.cat([torch.zeros(2, 4), box]),
                  "image_index": torch.zeros(3, dtype=torch.long), "num_points": 2}
        logits, iou_pred, object_logits = decode_sam2_prompts(model, model.image_features(predictor._transforms(image)[None]), inputs)
    assert logits.shape == (3, 4, 256, 256) and iou_pred.shape == (3, 4) and object_logits.shape == (3, 1)
    for row, (_, iou, low_res) in enumerate(expected):  # the predictor's three multimask outputs
        torch.testing.assert_close(logits[row, 1:], low_res[0], atol=1e-4, rtol=0)
        torch.testing.assert_close(iou_pred[row, 1:], iou[0], atol=1e-6, rtol=0)

    fitted, _ = STRETCHED.fit(image)
    mean, std = STRETCHED.pixel_stats(model)
    normalised = (torch.from_numpy(fitted).permute(2, 0, 1).float() - mean) / std
    half_level = 0.5 / 255 / min(std.flatten() / 255)
    assert (normalised - predictor._transforms(image)).abs().max() <= half_level + 1e-6


def test_grouped_batches_split_the_kinds_the_same_way_every_step():
    """group_kinds (SAM 2): round(0.3 x 24) = 7 boxes in every batch, after the points, so the
    decoder's two passes keep their shapes; the scenes, flips and objects are the ungrouped sampler's."""
    pool, _, _ = build_pool(3, seed=0, workers=1, log=lambda _: None, frame=STRETCHED)
    assert (pool.sizes[:, 2:] == 1024).all()  # stretched: the frame is the whole square
    plain, grouped = (BatchSampler(pool, 3, 8, seed=0, group_kinds=g) for g in (False, True))
    box_counts = set()
    for _ in range(4):
        a, b = plain.sample(), grouped.sample()
        assert b.num_points == 24 - 7 and not b.is_box[: b.num_points].any() and b.is_box[b.num_points :].all()
        box_counts.add(int(a.is_box.sum()))
        np.testing.assert_array_equal(a.scenes, b.scenes)
        np.testing.assert_array_equal(a.hflip, b.hflip)
        assert sorted(zip(a.image_index, a.objects)) == sorted(zip(b.image_index, b.objects))
    assert len(box_counts) > 1  # without grouping the count varies
    inputs = DeviceData(pool, torch.device("cpu")).assemble(b, *STRETCHED.pixel_stats(build_sam(NANO, device="cpu")))
    assert inputs["num_points"] == 17


def test_the_high_res_inputs_fade_in_over_the_first_steps():
    assert [fade_in_weight(step, 100, 0.4) for step in (0, 20, 40, 99)] == [0.0, 0.5, 1.0, 1.0]
    assert fade_in_weight(0, 100, 0.0) == 1.0  # no fade: full weight from the start
    embeddings, high_res = torch.ones(1, 2), [torch.ones(3), torch.ones(4)]
    faded_embeddings, faded = fade_high_res((embeddings, high_res), 0.25)
    assert faded_embeddings is embeddings and [level.tolist() for level in faded] == [[0.25] * 3, [0.25] * 4]
    with pytest.raises(SystemExit):  # vit_tiny has nothing to fade in
        main(["--high-res-fade-in", "0.5", "--smoke"])


@pytest.mark.slow
def test_loss_falls_on_a_fixed_batch():
    """Three optimizer steps of SAM 2's training step on one batch (points and a box, so both decoder
    passes), at a warmup-sized learning rate: the mask term (the best multimask output's focal +
    dice), taken before each step, falls at every step, and the total by the third. (The single-mask
    term starts far off, its seeded logits saturated, and swings while they come down.)"""
    pool, _, _ = build_pool(1, seed=0, workers=1, log=lambda _: None, frame=STRETCHED)
    model = build_sam(NANO, seed=0, device="cpu")
    prepare_for_training(model)
    batch = BatchSampler(pool, 1, 3, seed=0, p_box=0.5, group_kinds=True).sample()
    assert batch.num_points == 1  # a point, then round(0.5 x 3) = 2 boxes

    class OneBatch:
        def sample(self):
            return batch

    step = TrainingStep(model, make_optimizer(model, 1e-4, SAM2_NANO.settings["weight_decay"]), compiled=False,
                        family=SAM2_NANO)
    data, totals, masks = DeviceData(pool, torch.device("cpu")), [], []
    for _ in range(3):
        loss, parts = step(data, OneBatch())
        assert set(parts) >= {"mask", "single", "iou", "object"}
        totals.append(loss.item())
        masks.append(parts["mask"].item())
    assert masks[0] > masks[1] > masks[2] and totals[2] < totals[0], (masks, totals)


def test_embedding_mean_penalty_is_added_and_pulls_the_mean_down():
    """--embedding-mean-penalty W: the step's loss is the family's plus W x the squared spatial mean of
    the image embedding (logged as embed_mean, absent when W is 0); at a weight that dominates the loss,
    three steps on one batch bring that mean down at every step."""
    pool, _, _ = build_pool(1, seed=0, workers=1, log=lambda _: None, frame=STRETCHED)
    batch = BatchSampler(pool, 1, 2, seed=0, group_kinds=True).sample()

    class OneBatch:
        def sample(self):
            return batch

    data = DeviceData(pool, torch.device("cpu"))

    def step_with(weight: float):
        torch.manual_seed(0)
        model = build_sam(NANO, seed=0, device="cpu")
        prepare_for_training(model)
        return TrainingStep(model, make_optimizer(model, 1e-3, 0.0), compiled=False, family=SAM2_NANO,
                            embedding_penalty=weight)

    plain_loss, plain_parts = step_with(0.0)(data, OneBatch())
    assert "embed_mean" not in plain_parts
    step = step_with(100.0)
    means = []
    for n in range(3):
        loss, parts = step(data, OneBatch())
        if n == 0:  # the same weights and batch as the plain step: only the penalty differs
            torch.testing.assert_close(loss, plain_loss + 100.0 * parts["embed_mean"], rtol=1e-5, atol=1e-5)
        means.append(parts["embed_mean"].item())
    assert means[0] > means[1] > means[2], means
    # the nano's default (what its packaged run trained with); off for vit_tiny; a flag overrides both
    assert parse_args(["--model", NANO]).embedding_mean_penalty == 0.1
    assert parse_args([]).embedding_mean_penalty == 0.0
    assert parse_args(["--model", NANO, "--embedding-mean-penalty", "0"]).embedding_mean_penalty == 0.0


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke_sam2")
    manifest = main(["--model", NANO, "--smoke", "--steps", "2", "--device", "cpu", "--out", str(out)])
    return out, manifest


@pytest.mark.slow
def test_smoke_run_writes_an_official_sam2_checkpoint(smoke_run):
    out, manifest = smoke_run
    path = out / SAM2_NANO.checkpoint_name
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert set(saved) == {"model"}  # sam2's layout
    state = saved["model"]
    fp32 = {k for k, v in state.items() if v.dtype == torch.float32}
    assert fp32 == set(SAM2_NANO.fp32_keys) and all(v.dtype == torch.float16 for k, v in state.items() if k not in fp32)
    # Only the image path trains: the video modules are the seeded init, as saved.
    init = synthetic_state_dict(NANO, seed=0)
    key = "memory_attention.layers.0.self_attn.q_proj.weight"
    assert torch.equal(state[key], init[key].half())
    assert not torch.equal(state["sam_mask_decoder.pred_obj_score_head.layers.2.bias"],
                           init["sam_mask_decoder.pred_obj_score_head.layers.2.bias"].half())
    build_sam(NANO, checkpoint=path, device="cpu")  # strict, as users load it
    written = json.loads((out / "sam2.1_hiera_nano_trained.json").read_text())
    assert written["sha256"] == manifest["sha256"] and written["model_type"] == NANO and written["steps"] == 2
    assert {"heldout_point", "heldout_box", "scenes_point", "scenes_box"} <= set(written["validation"])
    with open(out / SAM2_NANO.log_name, newline="") as f:
        logged = [row for row in csv.DictReader(f) if row["loss"]]
    assert [int(row["step"]) for row in logged] == [1, 2] and all(float(row["object"]) > 0 for row in logged)
    assert (out / SAM2_NANO.curve_name).stat().st_size > 0 and not list(out.glob("*.tmp*"))


# --- the packaged "trained" checkpoint, by model type -----------------------------------------
def test_trained_names_each_model_types_own_file():
    assert resolve_checkpoint("trained") == resolve_checkpoint("trained", "vit_tiny")  # no model type: vit_tiny's
    assert checkpoint_module.TRAINED_CHECKPOINTS[NANO].name == SAM2_NANO.checkpoint_name


def test_a_missing_trained_file_says_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.setitem(checkpoint_module.TRAINED_CHECKPOINTS, NANO, tmp_path / SAM2_NANO.checkpoint_name)
    with pytest.raises(CheckpointError, match=rf"python -m tinysam.train --model {NANO}"):
        build_sam(NANO, checkpoint="trained", device="cpu")


def test_a_model_type_without_a_trained_file_says_what_to_pass():
    with pytest.raises(CheckpointError, match=r"no trained checkpoint ships for sam2.1_hiera_t: .*official"):
        build_sam("sam2.1_hiera_t", checkpoint="trained", device="cpu")
    with pytest.raises(CheckpointError, match=r"no trained checkpoint ships for vit_b.*checkpoint=None"):
        resolve_checkpoint("trained", "vit_b")


@pytest.mark.slow
def test_trained_builds_the_nano_from_its_file(smoke_run, monkeypatch):
    out, _ = smoke_run
    monkeypatch.setitem(checkpoint_module.TRAINED_CHECKPOINTS, NANO, out / SAM2_NANO.checkpoint_name)
    model = build_sam(NANO, checkpoint="trained", device="cpu")
    assert torch.equal(model.sam_mask_decoder.iou_token.weight.half(),
                       torch.load(out / SAM2_NANO.checkpoint_name, weights_only=True)["model"]["sam_mask_decoder.iou_token.weight"])
