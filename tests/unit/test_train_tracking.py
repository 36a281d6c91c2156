"""tinysam's tracking run (tinysam.train_tracking): its clip pool and windows, the rollout's gradients
(video modules only), the caches that inference mode made, a smoke run's checkpoint, and the
packaged nano tracking the gate's clip where its seeded video modules do not."""

from __future__ import annotations

import csv
import json
import warnings

import numpy as np
import pytest
import torch

from parity.compare.metrics import mask_iou
from parity.golden import manifest as golden_io
from parity.golden.videos import generate_clip
from parity.tasks.video.produce import at_input_size, prompts, track_clip
from samfast import build_sam_video
from samfast.checkpoint import TRAINED_CHECKPOINTS
from samfast.sam2.checkpoint import synthetic_state_dict
from samfast.sam2.memory.attention import MemoryAttention
from samfast.modeling.position_encoding import PositionEmbeddingSine
from tinysam.clips import MASK_SCALE, WINDOW, WindowSampler, build_clip_pool
from tinysam.rollout import (
    FROZEN_MODULES,
    VIDEO_MODULES,
    prepare_for_tracking,
    track_windows,
    tracking_loss,
    video_module_of,
)
from tinysam.train_tracking import main

NANO = "sam2.1_hiera_nano"
SIZE = 256


@pytest.fixture(scope="module")
def pool():
    return build_clip_pool(3, seed=0, size=SIZE, workers=1, log=lambda message: None)


def test_the_pool_is_the_same_made_by_workers_or_inline(pool):
    forked = build_clip_pool(3, seed=0, size=SIZE, workers=2, log=lambda message: None)
    for name in ("frames", "targets", "present", "points"):
        assert np.array_equal(getattr(forked, name), getattr(pool, name)), name


def test_each_window_clicks_inside_its_objects_on_its_first_frame(pool):
    """The click lands on a target cell its object covers, flipped windows included: frames, targets
    and clicks are flipped together."""
    sampler = WindowSampler(pool, windows=6, seed=3, device=torch.device("cpu"))
    flipped_seen = 0
    for _ in range(4):
        batch = sampler.sample()
        assert batch.frames.shape[1:] == (WINDOW, 3, SIZE, SIZE) and batch.present[:, 0].all()
        cells = (batch.points[:, 0] / MASK_SCALE).long()  # (N, 2) x, y on the low-res grid
        covered = batch.targets[torch.arange(len(cells)), 0, cells[:, 1], cells[:, 0]]
        assert (covered > 0).all(), covered
        flipped_seen += int((batch.points[:, 0, 0] > SIZE / 2).sum())
    assert flipped_seen > 0  # objects start left of the middle (parity.golden.videos): a right-half click is a flip


@pytest.fixture(scope="module")
def nano():
    predictor = build_sam_video(NANO, "trained", device="cpu")
    return at_input_size(predictor.model, SIZE)


def test_only_the_video_modules_learn(nano, pool):
    trainable = prepare_for_tracking(nano)
    assert all(not getattr(nano, name).training for name in FROZEN_MODULES) and nano.memory_attention.training
    batch = WindowSampler(pool, windows=1, seed=0, device=torch.device("cpu")).sample()
    outputs = track_windows(nano, batch)
    assert len(outputs) == WINDOW and outputs[1][0].shape == (len(batch.points), 1, SIZE // 4, SIZE // 4)
    loss, parts = tracking_loss(outputs, batch)
    loss.backward()
    learned = {video_module_of(name) for name, p in nano.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {"memory_attention", "memory_encoder", "obj_ptr_proj", "sam_mask_decoder.pred_obj_score_head"} <= learned
    assert learned <= set(VIDEO_MODULES)  # None (the image path) not among them
    assert sum(p.numel() for p in trainable) == sum(p.numel() for name, p in nano.named_parameters() if video_module_of(name))
    nano.zero_grad(set_to_none=True)


def test_caches_made_under_inference_mode_are_made_again_for_autograd():
    """A predictor's call (inference mode) fills the RoPE table and the sine encodings; a training
    step after it must not read them, or backward raises "Inference tensors cannot be saved"."""
    attention, encoding = MemoryAttention(256, 1, 64), PositionEmbeddingSine(256)
    features = torch.zeros(1, 256, 16, 16)
    with torch.inference_mode():
        assert attention.rotations(256, torch.device("cpu")).is_inference() and encoding(features).is_inference()
    assert not attention.rotations(256, torch.device("cpu")).is_inference()
    assert not encoding(features).is_inference()
    with torch.inference_mode():  # a normal tensor serves inference mode as it is: not made again
        table = attention.rotations(256, torch.device("cpu"))
        assert not table.is_inference() and attention.rotations(256, torch.device("cpu")) is table


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke_tracking")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fill-hole warnings without sam2's CUDA extension
        manifest = main(["--smoke", "--steps", "1", "--windows", "1", "--pool", "2", "--out", str(out)])
    return out, manifest


def test_smoke_run_trains_the_video_modules_and_keeps_the_image_path(smoke_run):
    out, manifest = smoke_run
    init = torch.load(TRAINED_CHECKPOINTS[NANO], weights_only=True)["model"]
    saved = torch.load(out / "sam2.1_hiera_nano_trained.pt", weights_only=True)["model"]
    assert saved.keys() == init.keys()
    changed = {video_module_of(key) for key in init if not torch.equal(init[key], saved[key])}
    assert "sam_mask_decoder.pred_obj_score_head" in changed and changed <= set(VIDEO_MODULES)
    assert all(saved[key].dtype == init[key].dtype for key in init)
    tracking = manifest["tracking"]
    assert tracking["steps"] == 1 and tracking["smoke"] is True and tracking["trained_modules"] == list(VIDEO_MODULES)
    assert set(tracking["validation"]["before"]) >= {"jf", "j_tracked"}
    # the image run's record is kept; the file's identity is the new file's, the init's is named in its section
    init_manifest = json.loads(TRAINED_CHECKPOINTS[NANO].with_suffix(".json").read_text())
    init_sha = init_manifest["sha256"]
    assert manifest["command"].startswith("python -m tinysam.train ") and init_sha in tracking["init"]
    # the packaged init was trained to track already: that run is kept, nested, not overwritten
    assert tracking["continued_from"] == init_manifest["tracking"] and "continued_from" in tracking["init"]
    assert manifest["sha256"] == golden_io.file_sha256(out / "sam2.1_hiera_nano_trained.pt") != init_sha
    with open(out / "sam2.1_hiera_nano_tracking_log.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["loss"] and rows[-1]["val_jf"]
    assert (out / "sam2.1_hiera_nano_tracking_curve.png").stat().st_size > 10_000


def test_init_without_its_manifest_is_refused(tmp_path, capsys):
    lone = tmp_path / "sam2.1_hiera_nano_trained.pt"
    lone.write_bytes(TRAINED_CHECKPOINTS[NANO].read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", "--init", str(lone), "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "sam2.1_hiera_nano_trained.json" in capsys.readouterr().err


def tracked_j(predictor) -> float:
    """Mean J against the ground truth over the tracked frames (after each object's click) of the
    video gate's default clip (seed 0, 6 frames), tracked as the gate tracks it."""
    clip = generate_clip(1, seed=0, frames=6)
    at_input_size(predictor.model, SIZE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outputs = track_clip(predictor, clip)
    return float(np.mean([mask_iou(outputs.masks[obj_id - 1, t], clip.masks[obj_id - 1, t])
                          for obj_id, clicked, _ in prompts(clip) for t in range(clicked + 1, 6)]))


def test_the_packaged_nano_tracks_where_seeded_video_modules_do_not():
    """Planted defect: the packaged file with its video modules put back to the seeded init."""
    trained = tracked_j(build_sam_video(NANO, "trained", device="cpu"))
    state = torch.load(TRAINED_CHECKPOINTS[NANO], weights_only=True)["model"]
    seeded = synthetic_state_dict(NANO, seed=0)
    untrained = {key: seeded[key] if video_module_of(key) else value for key, value in state.items()}
    before = tracked_j(build_sam_video(NANO, {"model": untrained}, device="cpu"))
    # measured on a 2-core CPU: 0.79 trained (the shipped file, sha256 8ca7b48b…), 0.30 seeded
    assert trained > 0.6 and trained - before > 0.3, (trained, before)
