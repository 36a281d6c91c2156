"""tinysam's trainer: target geometry, flips, prompts, SAM's loss, the schedule, and one smoke run (its losses pinned)."""

from __future__ import annotations

import csv
import hashlib
import json

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from parity.compare.metrics import mask_iou
from parity.golden.scenes import generate_scenes
from samfast import build_sam
from samfast.transforms import preprocess_shape
from tinysam.configs import SAM2_NANO, VIT_TINY
from tinysam.data import BatchSampler, DeviceData, build_pool, train_seeds
from tinysam.losses import mask_loss_table, output_ious, sam_loss
from tinysam.optimizer import learning_rate
from tinysam.targets import flip_images, flip_targets, lowres_target
from tinysam.train import main


@pytest.fixture(scope="module")
def sam():
    return build_sam("vit_tiny", device="cpu")


@pytest.fixture(scope="module")
def scene_masks():
    """(mask, (h, w)) of every object of two training-like scenes (seed 1000: a training seed)."""
    coco, _ = generate_scenes(2, seed=1000)
    out = []
    for ann in coco["annotations"]:
        rle = {"size": ann["segmentation"]["size"], "counts": ann["segmentation"]["counts"].encode("ascii")}
        mask = mask_utils.decode(rle).astype(bool)
        out.append((mask, preprocess_shape(*mask.shape, 1024)))
    return out


def _upsampled(sam, target: np.ndarray, input_size, original_size) -> np.ndarray:
    """A low-res target through Sam.postprocess_masks, as logits whose zero crossing is at half cover."""
    logits = (torch.from_numpy(target) - 0.5)[None, None] * 20
    return (sam.postprocess_masks(logits, input_size, original_size)[0, 0] > 0).numpy()


def test_lowres_target_reproduces_the_mask_through_postprocess(sam, scene_masks):
    ious = [mask_iou(_upsampled(sam, lowres_target(mask, size), size, mask.shape), mask) for mask, size in scene_masks]
    assert min(ious) > 0.9, ious
    assert np.mean(ious) > 0.97, ious


def test_a_target_that_ignores_the_padding_does_not(sam, scene_masks):
    """The planted defect: spreading the target over the whole 256 grid (as if the image filled the
    padded square) puts every object in the wrong place, and the geometry check sees it."""
    ious = [mask_iou(_upsampled(sam, lowres_target(mask, (1024, 1024)), size, mask.shape), mask)
            for mask, size in scene_masks if size != (1024, 1024)]
    assert np.mean(ious) < 0.7, ious


def test_target_values_are_covered_fractions():
    mask = np.zeros((300, 200), dtype=bool)  # resized to 1024 x 683: 3.4133 input px per original px
    mask[:150] = True
    target = lowres_target(mask, preprocess_shape(300, 200, 1024))
    assert target.shape == (256, 256) and target.dtype == np.float32
    assert target[:127, :170].min() == 1.0  # inside: fully covered
    assert target[129:].max() == 0.0 and target[:, 171:].max() == 0.0  # below the object; the padding
    assert target[:, 170].max() == pytest.approx(683 / 4 - 170, abs=1e-5)  # the cell across the crop edge
    assert target.sum() == pytest.approx(mask.mean() * 1024 * 683 / 16, rel=1e-6)  # area is preserved


@pytest.mark.parametrize("hflip, vflip", [(True, False), (False, True), (True, True)])
def test_flip_targets_match_targets_of_flipped_masks(scene_masks, hflip, vflip):
    for mask, (h, w) in scene_masks[:6]:
        flipped = mask[::-1 if vflip else 1, ::-1 if hflip else 1]
        expected = lowres_target(flipped, (h, w))
        got = flip_targets(torch.from_numpy(lowres_target(mask, (h, w)))[None], torch.tensor([[h, w]]),
                           torch.tensor([hflip]), torch.tensor([vflip]))[0].numpy()
        exact = (not hflip or w % 4 == 0) and (not vflip or h % 4 == 0)
        if exact:
            np.testing.assert_allclose(got, expected, atol=1e-5)
        else:  # mirrored about a line between cells: interpolated, within half a cell
            assert mask_iou(got >= 0.5, expected >= 0.5) > 0.9
            assert np.abs(got - expected).sum() < 0.5 * np.abs(expected - (expected >= 0.5)).sum() + 2 * np.sqrt(expected.sum())


def test_flip_images_mirrors_only_the_valid_region():
    rng = np.random.default_rng(0)
    h, w = 6, 5
    images = np.zeros((2, 3, 8, 8), dtype=np.uint8)
    images[:, :, :h, :w] = rng.integers(1, 255, (2, 3, h, w))
    sizes = torch.tensor([[h, w], [h, w]])
    out = flip_images(torch.from_numpy(images), sizes, torch.tensor([True, False]), torch.tensor([True, True])).numpy()
    np.testing.assert_array_equal(out[0, :, :h, :w], images[0, :, :h, :w][:, ::-1, ::-1])
    np.testing.assert_array_equal(out[1, :, :h, :w], images[1, :, :h, :w][:, ::-1, :])
    assert out[:, :, h:].max() == 0 and out[:, :, :, w:].max() == 0  # the padding stays bottom-right


@pytest.mark.parametrize("family", [VIT_TINY, SAM2_NANO], ids=lambda f: f.model_type)
def test_sampled_prompts_land_on_their_objects(family):
    """Points (flipped with their images) fall in cells their flipped targets cover; boxes enclose
    them; in each family's input frame (SAM 2's: stretched, its sampler grouping the kinds)."""
    pool, info, _ = build_pool(3, seed=0, workers=1, log=lambda _: None, frame=family.frame)
    assert info["seeds"] == train_seeds(0, 3) and min(info["seeds"]) >= 1000
    data = DeviceData(pool, torch.device("cpu"))
    sampler = BatchSampler(pool, batch=3, prompts=8, seed=0, p_box=0.3, p_centre=0.3, group_kinds=family.group_kinds)
    mean, std = torch.zeros(3, 1, 1), torch.ones(3, 1, 1)
    flipped = 0
    for _ in range(4):
        batch = sampler.sample()
        inputs = data.assemble(batch, mean, std)
        targets = inputs["targets"].numpy()
        flipped += int(batch.hflip.sum() + batch.vflip.sum())
        for p in range(len(batch.objects)):
            H, W, h, w = pool.sizes[batch.scenes[batch.image_index[p]]]
            # The point is an original pixel's corner in the input frame; its footprint's centre:
            x, y = batch.points[p] + 0.5 * np.array([w / W, h / H])
            assert targets[p, int(y // 4), int(x // 4)] > 0, (p, x, y)
            ys, xs = np.nonzero(targets[p] >= 0.5)
            if not batch.is_box[p] or len(xs) == 0:
                continue
            x0, y0, x1, y1 = batch.boxes[p]
            # The jitter moves each side by at most 20 px; the target's half-covered cells lie within.
            assert x0 - 20 <= xs.min() * 4 + 4 and xs.max() * 4 <= x1 + 20
            assert y0 - 20 <= ys.min() * 4 + 4 and ys.max() * 4 <= y1 + 20
    assert flipped > 0
    # Images: normalised, zero beyond the resized size, flipped inside it.
    images = inputs["images"]
    for b, s in enumerate(batch.scenes):
        _, _, h, w = pool.sizes[s]
        assert images[b, :, h:].abs().sum() == 0 and images[b, :, :, w:].abs().sum() == 0


def _disk(size=256, centre=(100, 120), radius=40):
    yy, xx = np.mgrid[:size, :size]
    return ((yy - centre[0]) ** 2 + (xx - centre[1]) ** 2 <= radius**2).astype(np.float32)


def test_loss_is_lower_for_the_right_mask():
    target = torch.from_numpy(_disk())[None]
    right = (target - 0.5) * 20
    shifted = (torch.from_numpy(_disk(centre=(140, 160))) - 0.5)[None] * 20
    empty = torch.full_like(right, -10.0)
    focal, dice = mask_loss_table(torch.stack([right, shifted, empty], dim=1), target)
    total = 20 * focal + dice
    assert total[0, 0] < total[0, 1] and total[0, 0] < total[0, 2]
    assert dice[0, 0] < 0.01 and dice[0, 2] > 0.99
    ious = output_ious(torch.stack([right, shifted, empty], dim=1), target)
    assert ious[0, 0] == 1.0 and 0 < ious[0, 1] < 1 and ious[0, 2] == 0.0


def test_min_over_outputs_trains_only_the_best_output():
    target = torch.from_numpy(_disk())[None].repeat(2, 1, 1)
    right = (target[0] - 0.5) * 20
    wrong = (torch.from_numpy(_disk(centre=(60, 60), radius=20)) - 0.5) * 20
    # Prompt 0: multimask output 2 (index 3 overall) is right; prompt 1: output 1 (index 2).
    logits = torch.stack([torch.stack([wrong, wrong, wrong, right]), torch.stack([wrong, wrong, right, wrong])])
    logits.requires_grad_(True)
    iou_pred = torch.full((2, 4), 0.5, requires_grad=True)
    loss, parts = sam_loss(logits, iou_pred, target)
    assert parts["best"].tolist() == [2, 1]  # indices among the three multimask outputs
    loss.backward()
    grad = logits.grad.abs().sum(dim=(2, 3))
    assert (grad[0, 1:3] == 0).all() and grad[0, 3] > 0 and grad[0, 0] > 0  # output 0: the single-mask loss
    assert (grad[1, [1, 3]] == 0).all() and grad[1, 2] > 0
    # The IoU head learns every output's real IoU.
    assert (iou_pred.grad != 0).all()
    assert parts["iou"] == pytest.approx(float(((0.5 - output_ious(logits.detach(), target)) ** 2).mean()))


def test_learning_rate_warms_up_then_decays_to_one_percent():
    lrs = [learning_rate(s, 100, 10, 1e-3) for s in range(101)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[100] == pytest.approx(1e-5)


# The losses of `python -m tinysam.train --smoke` (seed 0), recorded before the trainer was split into
# modules (tinysam.data, .losses, .loop, ...): step 1 checks the seeded init, scene pool, sampler,
# targets and loss; step 2 also the optimizer step. Thread counts move them by < 1e-6 (relative).
SMOKE_LOSSES = {  # step: (loss, mask, single, iou)
    1: (10.70996, 4.495543, 5.949841, 0.2645711),
    2: (5.584510, 2.789147, 2.611152, 0.1842110),
}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One --smoke run of two steps, shared by the tests below (it takes most of this file's time)."""
    out = tmp_path_factory.mktemp("smoke")
    manifest = main(["--smoke", "--steps", "2", "--device", "cpu", "--out", str(out)])
    return out, manifest


@pytest.mark.slow
def test_smoke_run_writes_a_loadable_checkpoint_and_manifest(smoke_run):
    tmp_path, manifest = smoke_run
    path = tmp_path / VIT_TINY.checkpoint_name
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert state["image_encoder.patch_embed.proj.weight"].dtype == torch.float16
    assert path.stat().st_size <= 16 * 2**20
    saved = json.loads((tmp_path / "vit_tiny_trained.json").read_text())
    assert saved["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() == manifest["sha256"]
    assert saved["steps"] == 2 and min(saved["data"]["seeds"]) >= 1000
    assert {"heldout_point", "heldout_box", "scenes_point", "scenes_box"} <= set(saved["validation"])
    assert (tmp_path / "training_curve.png").stat().st_size > 0
    assert (tmp_path / "training_log.csv").read_text().startswith("step,")
    build_sam("vit_tiny", checkpoint=path, device="cpu")  # the official layout, loaded as users load it
    assert not list(tmp_path.glob("*.tmp*"))


@pytest.mark.slow
def test_seeded_smoke_run_reproduces_the_recorded_losses(smoke_run):
    tmp_path, _ = smoke_run
    with open(tmp_path / "training_log.csv", newline="") as f:
        logged = {int(row["step"]): tuple(float(row[k]) for k in ("loss", "mask", "single", "iou"))
                  for row in csv.DictReader(f) if row["loss"]}
    assert logged == {step: pytest.approx(losses, rel=1e-5) for step, losses in SMOKE_LOSSES.items()}
