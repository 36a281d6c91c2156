"""Train the vit_tiny SAM from scratch on generated scenes: the packaged "trained" checkpoint.

    python -m tinysam.train [--minutes 5] [--seed 0] [--out samfast/weights] [--device cuda] [--smoke]

Random weights make half-image masks, so mask IoU on them means nothing (DESIGN.md). This script
gives vit_tiny masks worth comparing: it trains samfast's own modules, in the official state-dict
layout, on procedurally generated scenes (parity.scenes) whose instance masks are exact, the way
SAM trains its decoder:

- prompts per object: one positive point, uniform inside the mask or (often) the centre point
  that the published evaluation uses (parity.data.centre_point), or the tight box with jitter;
- supervision of all three multimask outputs with the min-over-outputs rule: focal (x20) + dice
  on the best-matching output only, plus MSE between the IoU head and each output's real IoU
  (the single-mask output 0 learns the same mask loss, so multimask_output=False works too);
- targets in the frame of the decoder's 256x256 logits, which cover the padded 1024 square
  after resize-longest-side (see `lowres_target`): soft area fractions, so the zero crossing
  that `Sam.postprocess_masks` upsamples falls between cells where the true edge lies.

Training seeds (1000 + 10000 * seed + chunk) are disjoint from the embedded evaluation set
(generate_scenes(16, seed=0)) and the held-out validation set (generate_scenes(64, seed=999)).
The whole run, data generation and validation included, fits --minutes: after a short
calibration the step count is fixed from the measured speed, so the cosine schedule ends on
time; `--steps N` replays a run step for step (the manifest records N).

Outputs in --out (each written under a temporary name, then renamed): vit_tiny_trained.pt (fp16
state dict, loads with torch.load(weights_only=True)), vit_tiny_trained.json (manifest: sha256,
command, steps, seconds, seeds, final validation, torch and GPU), training_log.csv and
training_curve.png.
"""

from __future__ import annotations

import time

_START = time.monotonic()  # the --minutes budget counts from here, before torch is imported

import argparse  # noqa: E402
import csv  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import mmap  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from pycocotools import mask as mask_utils  # noqa: E402
from torch.profiler import record_function  # noqa: E402

from parity.data import _index, centre_point, load_dataset, mask_box  # noqa: E402
from parity.evaluate import prompts_for  # noqa: E402
from parity.metrics import mask_iou, miou_vs_ground_truth  # noqa: E402
from parity.scenes import SCENES_VERSION, generate_scenes  # noqa: E402
from parity.settings import DataNotFoundError  # noqa: E402
from samfast import SamPredictor, build_sam  # noqa: E402
from samfast.checkpoint import WEIGHTS_DIR  # noqa: E402
from samfast.config import IMAGE_SIZE  # noqa: E402
from samfast.transforms import preprocess_shape, resize_longest_side, scale_coords, to_rgb_uint8  # noqa: E402

MODEL_TYPE = "vit_tiny"
CHECKPOINT_NAME = "vit_tiny_trained.pt"
LOW_RES = 256  # side of the decoder's logits: 4 x the 64 x 64 image embedding
CELL = IMAGE_SIZE // LOW_RES  # input pixels (of the padded 1024 square) per low-res cell
MAX_OBJECTS = 10  # generate_scenes draws 3..10 objects per scene
POINTS_PER_OBJECT = 24  # random interior points kept per object (slot 0 holds the centre point)
SCENES_PER_SEED = 20  # one generate_scenes call (one worker job) makes this many scenes
HELDOUT_SEED, HELDOUT_IMAGES = 999, 64
TARGET_MIOU = 0.85
FOCAL_WEIGHT, DICE_WEIGHT, IOU_WEIGHT = 20.0, 1.0, 1.0
# Kept in fp32 in the fp16 file: the prompt encoder's Fourier frequencies multiply coordinates
# by 2*pi before sin/cos, where fp16 rounding would move every encoding (2 x 128 values, 1 KB).
FP32_KEYS = ("prompt_encoder.pe_layer.positional_encoding_gaussian_matrix",)


def train_seeds(seed: int, num_scenes: int) -> list[int]:
    """generate_scenes seeds of the training pool: >= 1000, so never 0 (evaluation) or 999 (held out)."""
    return [1000 + 10_000 * seed + k for k in range(math.ceil(num_scenes / SCENES_PER_SEED))]


# --- targets: ground truth in the frame of the low-res logits ----------------------------------
def lowres_target(mask: np.ndarray, input_size: tuple[int, int]) -> np.ndarray:
    """The fraction of each 256 x 256 logits cell that the mask covers, float32 in [0, 1].

    SAM resizes the image so that its longest side is 1024 (input_size = (h, w), from
    samfast.transforms.preprocess_shape), pads it to 1024 x 1024 at the bottom and right, and
    predicts logits on a 256 x 256 grid over that padded square; Sam.postprocess_masks upsamples
    them to 1024, crops [:h, :w] and resizes to the original (H, W). So cell (i, j) covers input
    pixels [4i, 4i + 4) x [4j, 4j + 4), i.e. original pixels [4i H/h, (4i + 4) H/h) x
    [4j W/w, (4j + 4) W/w): a box with fractional edges, integrated exactly from the mask's
    summed-area table (which is bilinear between whole pixels). Cells over padding get 0, cells
    across the crop edge the covered share of their full area.
    """
    mask = np.asarray(mask, dtype=bool)
    H, W = mask.shape
    h, w = input_size
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return np.zeros((LOW_RES, LOW_RES), dtype=np.float32)
    # Integrate over the mask's bounding box only: outside it the mask is empty, so the integral
    # up to any point equals the box's summed-area table at that point clipped into the box.
    y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    table = np.zeros((y1 - y0 + 1, x1 - x0 + 1))
    table[1:, 1:] = mask[y0:y1, x0:x1].cumsum(0, dtype=np.float64).cumsum(1)
    r, r_frac = _edges(H, h, y0, y1)
    c, c_frac = _edges(W, w, x0, x1)
    table = table[r] * (1 - r_frac)[:, None] + table[r + 1] * r_frac[:, None]
    table = table[:, c] * (1 - c_frac) + table[:, c + 1] * c_frac  # (257, 257): the integral at cell corners
    area = table[1:, 1:] - table[:-1, 1:] - table[1:, :-1] + table[:-1, :-1]
    cell_area = (CELL * H / h) * (CELL * W / w)
    return np.clip(area / cell_area, 0.0, 1.0).astype(np.float32)


def _edges(original: int, resized: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The 257 cell edges along one axis, in original pixels relative to the box [lo, hi) and
    clipped into it, as (whole part, fraction) for interpolating the box's summed-area table."""
    edges = np.clip(np.arange(LOW_RES + 1) * (CELL * original / resized) - lo, 0, hi - lo)
    whole = np.minimum(np.floor(edges), hi - lo - 1).astype(np.int64)
    return whole, edges - whole


# --- flips inside the valid region (the padding stays bottom-right, as SAM sees it) -----------
def flip_images(images: torch.Tensor, sizes: torch.Tensor, hflip: torch.Tensor, vflip: torch.Tensor) -> torch.Tensor:
    """Mirror (B, C, S, S) images inside their valid (h, w) corner; sizes (B, 2) as (h, w)."""
    side = images.shape[-1]
    pos = torch.arange(side, device=images.device)[None]
    h, w = sizes[:, :1], sizes[:, 1:]
    cols = torch.where(hflip[:, None] & (pos < w), w - 1 - pos, pos)
    rows = torch.where(vflip[:, None] & (pos < h), h - 1 - pos, pos)
    images = images.gather(3, cols[:, None, None, :].expand(images.shape))
    return images.gather(2, rows[:, None, :, None].expand(images.shape))


def flip_targets(targets: torch.Tensor, sizes: torch.Tensor, hflip: torch.Tensor, vflip: torch.Tensor) -> torch.Tensor:
    """Mirror (P, 256, 256) low-res targets the way flip_images mirrors their images.

    Mirroring input column x to w - x moves cell u's centre (4u + 2) to w - 4u - 2, which is
    cell coordinate w/4 - 1 - u: whole when w is a multiple of 4 (exact), otherwise between two
    cells, where the covered fractions are interpolated linearly.
    """
    sizes = sizes.to(targets.dtype)
    targets = _resample_last(targets, sizes[:, 1], hflip)
    return _resample_last(targets.transpose(1, 2), sizes[:, 0], vflip).transpose(1, 2)


def _resample_last(targets: torch.Tensor, extent: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    grid = targets.shape[-1]
    u = torch.arange(grid, device=targets.device, dtype=targets.dtype)[None]
    source = torch.where(flip[:, None], extent[:, None] / CELL - 1 - u, u)  # (P, grid)
    whole = torch.floor(source)
    frac = (source - whole)[:, None, :]
    padded = F.pad(targets, (1, 0))  # index 0 stands for "left of the image": empty
    lo = (whole + 1).clamp(0, grid).long()[:, None, :].expand(targets.shape)
    hi = (whole + 2).clamp(0, grid).long()[:, None, :].expand(targets.shape)
    return padded.gather(-1, lo) * (1 - frac) + padded.gather(-1, hi) * frac


# --- loss -------------------------------------------------------------------------------------
def mask_loss_table(logits: torch.Tensor, targets: torch.Tensor, gamma: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output sigmoid focal loss (mean over pixels) and dice loss: two (P, C) tables.

    logits (P, C, h, w); targets (P, h, w) in [0, 1] (soft at edges). No alpha weighting: with
    soft targets it would move the 0.5 crossing, i.e. shrink every mask.
    """
    logits = logits.float()
    t = targets[:, None].float().expand_as(logits)
    prob = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, t, reduction="none")
    p_t = prob * t + (1 - prob) * (1 - t)
    focal = (ce * (1 - p_t) ** gamma).mean(dim=(2, 3))
    inter = (prob * t).sum(dim=(2, 3))
    dice = 1 - (2 * inter + 1) / (prob.sum(dim=(2, 3)) + t.sum(dim=(2, 3)) + 1)
    return focal, dice


@torch.no_grad()
def output_ious(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(P, C) IoU of each output mask (logits > 0) with the target (covered >= half), at low res."""
    pred = logits > 0
    truth = (targets >= 0.5)[:, None]
    inter = (pred & truth).sum(dim=(2, 3)).float()
    union = (pred | truth).sum(dim=(2, 3)).float()
    return torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(union))


def sam_loss(logits: torch.Tensor, iou_pred: torch.Tensor, targets: torch.Tensor,
             single_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAM's training loss for (P, 4, h, w) logits and (P, 4) IoU predictions (output 0 = single mask).

    The mask loss (20 focal + 1 dice) of the three multimask outputs counts only for the output
    that matches best (the min over outputs), so each can specialise on one reading of an
    ambiguous prompt; the IoU head learns every output's real IoU (MSE).
    """
    focal, dice = mask_loss_table(logits, targets)
    table = FOCAL_WEIGHT * focal + DICE_WEIGHT * dice  # (P, 4)
    best = table[:, 1:].argmin(dim=1)
    mask_term = table[:, 1:].gather(1, best[:, None]).mean()
    single_term = table[:, 0].mean()
    iou_term = F.mse_loss(iou_pred.float(), output_ious(logits, targets))
    total = mask_term + single_weight * single_term + IOU_WEIGHT * iou_term
    return total, {"mask": mask_term.detach(), "single": single_term.detach(), "iou": iou_term.detach(),
                   "best": best.detach()}


# --- the scene pool: generated in worker processes into shared memory -------------------------
@dataclass
class Pool:
    """Training scenes pre-resized to SAM's input frame. Images and targets become torch tensors
    on the training device; prompts stay on the host, where batches are sampled."""

    images: np.ndarray  # (N, 1024, 1024, 3) uint8, resized, zero outside [:h, :w]
    targets: np.ndarray  # (N, MAX_OBJECTS, 256, 256) uint8, covered fraction x 255
    counts: np.ndarray  # (N,) objects per scene
    sizes: np.ndarray  # (N, 4) original H, W and resized h, w
    points: np.ndarray  # (N, MAX_OBJECTS, 1 + POINTS_PER_OBJECT, 2) x, y original pixel indices; [.., 0] = centre
    boxes: np.ndarray  # (N, MAX_OBJECTS, 4) x0, y0, x1 (exclusive), y1, original pixels

    @classmethod
    def allocate(cls, n: int, shared: bool) -> Pool:
        def array(shape, dtype):
            if not shared:
                return np.zeros(shape, dtype)
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            # An anonymous MAP_SHARED mapping: forked workers write into the parent's pages.
            return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)

        return cls(
            images=array((n, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8),
            targets=array((n, MAX_OBJECTS, LOW_RES, LOW_RES), np.uint8),
            counts=array((n,), np.int64),
            sizes=array((n, 4), np.int64),
            points=array((n, MAX_OBJECTS, 1 + POINTS_PER_OBJECT, 2), np.float32),
            boxes=array((n, MAX_OBJECTS, 4), np.float32),
        )

    def __len__(self) -> int:
        return len(self.counts)


_POOL: Pool | None = None  # set in the parent before forking; the workers inherit it


def _fill_chunk(job: tuple[int, int, int]) -> tuple[int, int]:
    """Generate generate_scenes(count, seed=seed) into pool slots first .. first + count - 1."""
    first, count, seed = job
    pool = _POOL
    coco, images = generate_scenes(count, seed=seed)
    rng = np.random.default_rng([seed, 1])  # interior points: a stream apart from the scenes' own
    slot_of = {info["id"]: first + k for k, info in enumerate(coco["images"])}
    for info in coco["images"]:
        slot = slot_of[info["id"]]
        image = images[info["file_name"]]
        H, W = image.shape[:2]
        h, w = preprocess_shape(H, W, IMAGE_SIZE)
        pool.images[slot, :h, :w] = resize_longest_side(image, IMAGE_SIZE)
        pool.sizes[slot] = (H, W, h, w)
    for ann in coco["annotations"]:
        slot = slot_of[ann["image_id"]]
        k = pool.counts[slot]
        if k >= MAX_OBJECTS:
            continue
        mask = mask_utils.decode({"size": ann["segmentation"]["size"],
                                  "counts": ann["segmentation"]["counts"].encode("ascii")}).astype(bool)
        H, W, h, w = pool.sizes[slot]
        pool.targets[slot, k] = np.rint(lowres_target(mask, (h, w)) * 255).astype(np.uint8)
        ys, xs = np.nonzero(mask)
        pick = rng.integers(0, len(xs), POINTS_PER_OBJECT)
        pool.points[slot, k, 0] = centre_point(mask)
        pool.points[slot, k, 1:, 0], pool.points[slot, k, 1:, 1] = xs[pick], ys[pick]
        pool.boxes[slot, k] = mask_box(mask)
        pool.counts[slot] = k + 1
    return count, len(coco["annotations"])


def build_pool(num_scenes: int, seed: int, workers: int, log=print, while_waiting=None) -> tuple[Pool, dict, object]:
    """num_scenes training scenes from train_seeds(seed), made by `workers` forked processes
    (inline when workers <= 1). while_waiting() runs in this process meanwhile (after the fork,
    so it may start CUDA). Returns the pool, what the manifest records about it, and
    while_waiting's result."""
    global _POOL
    start = time.monotonic()
    seeds = train_seeds(seed, num_scenes)
    jobs = [(k * SCENES_PER_SEED, min(SCENES_PER_SEED, num_scenes - k * SCENES_PER_SEED), s) for k, s in enumerate(seeds)]
    _POOL = Pool.allocate(num_scenes, shared=workers > 1)
    waited = None
    try:
        if workers > 1:
            with multiprocessing.get_context("fork").Pool(workers) as procs:
                pending = procs.map_async(_fill_chunk, jobs, chunksize=1)
                waited = while_waiting() if while_waiting else None
                results = pending.get()
        else:
            results = [_fill_chunk(job) for job in jobs]
            waited = while_waiting() if while_waiting else None
        pool = _POOL
    finally:
        _POOL = None
    seconds = time.monotonic() - start
    annotations = sum(r[1] for r in results)
    log(f"data: {num_scenes} scenes, {annotations} objects from seeds {seeds[0]}..{seeds[-1]} "
        f"in {seconds:.1f} s with {max(workers, 1)} worker(s){' (set-up alongside)' if while_waiting else ''}")
    info = {"generator": SCENES_VERSION, "scenes": num_scenes, "annotations": annotations, "seeds": seeds,
            "scenes_per_seed": SCENES_PER_SEED, "seconds": round(seconds, 2), "workers": max(workers, 1)}
    return pool, info, waited


# --- batches ----------------------------------------------------------------------------------
@dataclass
class Batch:
    """One step's scenes and prompts, in numpy on the host (coordinates in the 1024 input frame)."""

    scenes: np.ndarray  # (B,) pool indices
    hflip: np.ndarray  # (B,) bool
    vflip: np.ndarray  # (B,) bool
    image_index: np.ndarray  # (P,) which of the B images each prompt belongs to
    objects: np.ndarray  # (P,) object slot within its scene
    is_box: np.ndarray  # (P,) bool
    points: np.ndarray  # (P, 2) x, y
    boxes: np.ndarray  # (P, 4) x0, y0, x1, y1


class BatchSampler:
    """Scenes in shuffled passes over the pool, random flips, `prompts` objects per scene (all of
    them, some twice, when a scene has fewer), and a random prompt per object."""

    def __init__(self, pool: Pool, batch: int, prompts: int, seed: int,
                 p_box: float = 0.3, p_centre: float = 0.4, flips: bool = True):
        self.pool, self.batch, self.prompts = pool, batch, prompts
        self.p_box, self.p_centre, self.flips = p_box, p_centre, flips
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._usable = np.flatnonzero(pool.counts > 0)  # occlusion may, rarely, leave a scene empty
        self._order, self._next = np.empty(0, np.int64), 0

    def _scenes(self) -> np.ndarray:
        out = []
        while len(out) < self.batch:
            if self._next >= len(self._order):
                self._order, self._next = self.rng.permutation(self._usable), 0
            take = self._order[self._next : self._next + self.batch - len(out)]
            self._next += len(take)
            out.extend(take.tolist())
        return np.array(out, dtype=np.int64)

    def sample(self) -> Batch:
        rng, pool, K = self.rng, self.pool, self.prompts
        scenes = self._scenes()
        B = len(scenes)
        hflip = (rng.random(B) < 0.5) & self.flips
        vflip = (rng.random(B) < 0.5) & self.flips
        objects = []
        for s in scenes:
            n = int(pool.counts[s])
            chosen = rng.permutation(n)[:K]
            if n < K:
                chosen = np.concatenate([chosen, rng.integers(0, n, K - n)])
            objects.append(chosen)
        objects = np.concatenate(objects)
        image_index = np.repeat(np.arange(B), K)
        scene_of = scenes[image_index]
        kind = rng.random(len(objects))
        is_box = kind < self.p_box
        candidate = np.where(kind < self.p_box + self.p_centre, 0, rng.integers(1, 1 + POINTS_PER_OBJECT, len(objects)))
        H, W, h, w = (pool.sizes[scene_of, i].astype(np.float64) for i in range(4))
        hf, vf = hflip[image_index], vflip[image_index]
        # Points: mirrored pixel indices (x -> W - 1 - x), then scaled as samfast.transforms.scale_coords.
        px, py = pool.points[scene_of, objects, candidate].T.astype(np.float64)
        px, py = np.where(hf, W - 1 - px, px), np.where(vf, H - 1 - py, py)
        points = np.stack([px * w / W, py * h / H], axis=1)
        # Boxes: mirrored with the exclusive right/bottom edge (x0, x1 -> W - x1, W - x0), scaled,
        # then SAM's jitter: noise of 10% of the side, at most 20 input pixels, kept in the image.
        x0, y0, x1, y1 = pool.boxes[scene_of, objects].T.astype(np.float64)
        x0, x1 = np.where(hf, W - x1, x0), np.where(hf, W - x0, x1)
        y0, y1 = np.where(vf, H - y1, y0), np.where(vf, H - y0, y1)
        boxes = np.stack([x0 * w / W, y0 * h / H, x1 * w / W, y1 * h / H], axis=1)
        side = np.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]] * 2, axis=1)
        noise = np.clip(rng.standard_normal(boxes.shape) * 0.1 * side, -20.0, 20.0)
        boxes = np.clip(boxes + noise, 0.0, np.stack([w, h, w, h], axis=1))
        boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2] + 1.0)
        return Batch(scenes, hflip, vflip, image_index, objects, is_box,
                     points.astype(np.float32), boxes.astype(np.float32))


class DeviceData:
    """The pool's images and targets as tensors on the training device, and batch assembly there."""

    def __init__(self, pool: Pool, device: torch.device):
        self.pool, self.device = pool, device
        # On the GPU the whole pool lives in device memory: a batch is a gather, never a host copy.
        self.images = torch.from_numpy(pool.images).to(device)
        self.targets = torch.from_numpy(pool.targets).to(device)
        self.sizes = torch.from_numpy(pool.sizes[:, 2:].copy()).to(device)  # resized (h, w)

    def _put(self, array: np.ndarray) -> torch.Tensor:
        # non_blocking from pageable memory returns once the bytes are staged: no stream sync.
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)

    def assemble(self, batch: Batch, pixel_mean: torch.Tensor, pixel_std: torch.Tensor) -> dict[str, torch.Tensor]:
        scenes = self._put(batch.scenes)
        hflip, vflip = self._put(batch.hflip), self._put(batch.vflip)
        image_index = self._put(batch.image_index)
        sizes = self.sizes[scenes]
        images = flip_images(self.images[scenes].permute(0, 3, 1, 2), sizes, hflip, vflip)
        # SAM normalises, then zero-pads (Sam.preprocess): padding is 0 after normalisation.
        pos = torch.arange(IMAGE_SIZE, device=self.device)
        valid = (pos[None, :, None] < sizes[:, 0, None, None]) & (pos[None, None, :] < sizes[:, 1, None, None])
        images = (images.float() - pixel_mean) / pixel_std * valid[:, None]
        targets = self.targets[scenes[image_index], self._put(batch.objects)].float() / 255.0
        targets = flip_targets(targets, sizes[image_index], hflip[image_index], vflip[image_index])
        return {
            "images": images,
            "targets": targets,
            "image_index": image_index,
            "is_box": self._put(batch.is_box),
            "points": self._put(batch.points)[:, None],
            "boxes": self._put(batch.boxes),
        }


def decode_prompts(model, embeddings: torch.Tensor, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """All 4 mask logits (P, 4, 256, 256) and IoU predictions (P, 4) for a mix of point and box
    prompts over several images, in one decoder pass. A point prompt (point + SAM's padding
    "not a point") and a box (two corners) are both two sparse tokens, so they share a batch."""
    pe = model.prompt_encoder
    # Outside autocast: the Fourier features are sin/cos of arguments up to ~100, which bf16
    # matmuls would scramble (the prompt encoder keeps them fp32 in every samfast stage, too).
    with torch.autocast(embeddings.device.type, enabled=False):
        labels = torch.ones(inputs["points"].shape[:2], dtype=torch.int, device=embeddings.device)
        point_tokens, dense = pe(points=(inputs["points"], labels), boxes=None, masks=None)
        box_tokens, _ = pe(points=None, boxes=inputs["boxes"], masks=None)
        sparse = torch.where(inputs["is_box"][:, None, None], box_tokens, point_tokens)
        image_pe = pe.get_dense_pe()
    return model.mask_decoder.predict_masks(embeddings, image_pe, sparse, dense, inputs["image_index"])


# --- validation: the published evaluation through samfast.SamPredictor -------------------------
@dataclass
class ValidationSet:
    """Samples with at least one object, and their resized input images once made on a device."""

    name: str
    samples: list
    inputs: list[torch.Tensor] | None = None

    @classmethod
    def of(cls, name: str, dataset) -> ValidationSet:
        return cls(name, [s for s in dataset.samples if s.annotations])

    def input_images(self, device: torch.device) -> list[torch.Tensor]:
        """(1, 3, h, w) uint8 tensors, resized as SamPredictor.set_image resizes (longest side 1024)."""
        if self.inputs is None or self.inputs[0].device != device:
            self.inputs = [torch.as_tensor(resize_longest_side(to_rgb_uint8(s.image), IMAGE_SIZE), device=device)
                           .permute(2, 0, 1)[None].contiguous() for s in self.samples]
        return self.inputs


def heldout_dataset(num_images: int = HELDOUT_IMAGES, seed: int = HELDOUT_SEED):
    """generate_scenes(num_images, seed) through parity.data's one loading path (prompts, skips)."""
    coco, images = generate_scenes(num_images, seed=seed)
    return _index(f"scenes-seed{seed}", json.dumps(coco, sort_keys=True).encode(), lambda f: images[f], None)


@torch.no_grad()
def validate(model, vset: ValidationSet, prompts: tuple[str, ...] = ("point",)) -> dict[str, dict]:
    """mIoU vs ground truth at full resolution, per prompt kind: one prompt per object (the
    centre point, or the tight box), keeping the output with the highest predicted IoU, as the
    published evaluation. Each image is embedded once (SamPredictor.set_torch_image) and all its
    prompts of a kind decode in one SamPredictor.predict_torch call."""
    was_training = model.training
    model.eval()
    predictor = SamPredictor(model)
    records: dict[str, list] = {kind: [] for kind in prompts}
    for sample, image in zip(vset.samples, vset.input_images(model.device)):
        predictor.set_torch_image(image, sample.image.shape[:2])
        for kind in prompts:
            p = prompts_for(sample, kind)
            if kind == "point":
                coords = _to_input_frame(p.point_coords, predictor)
                labels = torch.ones(coords.shape[:2], dtype=torch.int, device=coords.device)
                masks, scores, _ = predictor.predict_torch(coords, labels)
            else:
                boxes = _to_input_frame(p.boxes.reshape(-1, 2, 2), predictor).reshape(-1, 4)
                masks, scores, _ = predictor.predict_torch(None, None, boxes)
            best = scores.float().argmax(dim=1)
            masks = masks[torch.arange(len(best), device=best.device), best].cpu().numpy()
            records[kind] += [(a.category_id, mask_iou(m, a.mask)) for a, m in zip(sample.annotations, masks)]
    model.train(was_training)
    out = {}
    for kind, recs in records.items():
        summary = miou_vs_ground_truth(recs)
        out[kind] = {"miou": round(summary["mean"], 4), "count": summary["count"]}
    return out


def _to_input_frame(coords: np.ndarray, predictor: SamPredictor) -> torch.Tensor:
    scaled = scale_coords(coords, predictor.original_size, predictor.long_side)
    return torch.as_tensor(scaled, dtype=torch.float, device=predictor.device)


# --- schedule ---------------------------------------------------------------------------------
def learning_rate(step: int, total: int, warmup: int, base: float, final_ratio: float = 0.01) -> float:
    """Linear warmup over `warmup` steps, then cosine from base down to base * final_ratio at `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _param_groups(model, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and kernels only: not on norms, biases, embeddings or positional tables."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        no_decay = param.ndim < 2 or "pos" in name.split(".")[-1] or ".point_embeddings." in name \
            or name.endswith(("_token.weight", "_tokens.weight", "_embed.weight"))
        (plain if no_decay else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


# --- outputs ----------------------------------------------------------------------------------
def save_checkpoint(model, path: Path) -> str:
    """fp16 state dict (official layout, plain dict of tensors), written to a temp name then renamed; sha256."""
    state = {k: v.detach().to("cpu", torch.float32 if k in FP32_KEYS else torch.float16).contiguous()
             for k, v in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_log_csv(path: Path, rows: list[dict]) -> None:
    fields = ["step", "seconds", "lr", "loss", "mask", "single", "iou", "steps_per_s", "val_miou"]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def plot_curve(path: Path, rows: list[dict], final: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    train = [r for r in rows if r.get("loss") is not None]
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="total")
    ax_loss.plot([r["step"] for r in train], [r["mask"] for r in train], label="mask (20 focal + dice)")
    ax_loss.plot([r["step"] for r in train], [r["iou"] for r in train], label="IoU head MSE")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_title("training loss")
    ax_loss.legend()
    val = [r for r in rows if r.get("val_miou") is not None]
    ax_val.plot([r["step"] for r in val], [r["val_miou"] for r in val], "o-", label=f"held-out (seed {HELDOUT_SEED}), point")
    for name, marker in (("scenes_point", "s"), ("heldout_box", "^")):
        if final.get(name):
            ax_val.plot([final["step"]], [final[name]["miou"]], marker, label=f"final {name.replace('_', ', ')}")
    ax_val.axhline(TARGET_MIOU, color="grey", linestyle="--", label=f"target {TARGET_MIOU}")
    ax_val.set_ylim(0, 1)
    ax_val.set_xlabel("step")
    ax_val.set_title("validation mIoU (full resolution)")
    ax_val.legend(loc="lower right")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


# --- the run ----------------------------------------------------------------------------------
CALIBRATE_STEPS = (10, 30)  # steps between which the speed is measured (after kernel warm-up)
SCHEDULE_MARGIN = 0.97  # of the measured speed, so the cosine ends before the budget does


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tinysam.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="wall budget of the whole run, data and validation included")
    p.add_argument("--steps", type=int, help="fixed step count (replays a run); default: as many as --minutes allows")
    p.add_argument("--seed", type=int, default=0, help="initial weights, data seeds and sampling")
    p.add_argument("--out", type=Path, default=WEIGHTS_DIR, help=f"output folder (default {WEIGHTS_DIR})")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--pool", type=int, help="training scenes generated up front (default 4000)")
    p.add_argument("--batch", type=int, help="images per step (default 16)")
    p.add_argument("--prompts", type=int, help="prompts (objects) per image (default 8)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, help="warmup steps (default 100)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="torch.compile the training step (default: on the GPU; see TrainingStep)")
    p.add_argument("--workers", type=int, help="data generation processes (default: CPU count - 1)")
    p.add_argument("--log-every", type=int, help="steps between progress lines (default 25)")
    p.add_argument("--val-every", type=float, help="seconds between validations, 0: only at the end (default 30)")
    p.add_argument("--val-images", type=int, help=f"held-out scenes, generate_scenes seed {HELDOUT_SEED} (default {HELDOUT_IMAGES})")
    p.add_argument("--smoke", action="store_true",
                   help="prove the pipeline on the CPU: 3 steps of 1 image x 4 prompts on 8 scenes, validation on 1 scene")
    args = p.parse_args(argv)
    defaults = SMOKE_DEFAULTS if args.smoke else FULL_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def _cpu_count() -> int:
    """CPUs this process may run on (a container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


FULL_DEFAULTS = dict(pool=4000, batch=16, prompts=8, warmup=100, workers=max(1, _cpu_count() - 1),
                     log_every=25, val_every=30.0, val_images=HELDOUT_IMAGES)
SMOKE_DEFAULTS = dict(pool=8, steps=3, compile=False, batch=1, prompts=4, warmup=1, workers=1, log_every=1, val_every=0.0,
                      val_images=1, device="cpu")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python -m tinysam.train " + shlex.join(sys.argv[1:] if argv is None else argv)
    start = _START if argv is None else time.monotonic()
    deadline = start + 60.0 * args.minutes
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if args.compile is None:
        args.compile = cuda

    def log(message: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)

    def prepare():  # runs while the workers generate the pool
        torch.manual_seed(args.seed)
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        model = build_sam(MODEL_TYPE, seed=args.seed, device=device, stages="fp32")  # seeded random init
        heldout = ValidationSet.of(f"held-out (seed {HELDOUT_SEED})", heldout_dataset(args.val_images))
        embedded = ValidationSet.of("scenes (embedded evaluation)", load_dataset("scenes", limit=args.val_images if args.smoke else None))
        heldout.input_images(device), embedded.input_images(device)
        return model, heldout, embedded

    # Fork the data workers before anything starts CUDA in this process.
    pool, data_info, (model, heldout, embedded) = build_pool(args.pool, args.seed, args.workers, log, prepare)
    if cuda:
        need, free = pool.images.nbytes + pool.targets.nbytes, torch.cuda.mem_get_info(device)[0]
        if need > 0.5 * free:
            raise SystemExit(f"the pool ({need / 2**30:.1f} GiB) would take over half of the free GPU memory "
                             f"({free / 2**30:.1f} GiB): pass a smaller --pool")
    data = DeviceData(pool, device)
    del pool.images, pool.targets  # the device copies are the ones used (on the CPU they share memory)

    prepare_for_training(model)
    log(f"model: {MODEL_TYPE} from scratch, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters on "
        f"{torch.cuda.get_device_name(device) + ' (bf16 autocast)' if cuda else 'cpu (fp32)'}"
        f"{', compiled (the first steps compile, about a minute on an H100)' if args.compile else ''}; "
        f"batch {args.batch} images x {args.prompts} prompts")
    rows, state = train(model, data, BatchSampler(pool, args.batch, args.prompts, args.seed), heldout,
                        args, deadline, start, log)
    return finish(model, heldout, embedded, rows, state, data_info, args, command, start, log)


def prepare_for_training(model) -> None:
    model.train().requires_grad_(True)
    for module in model.modules():
        if hasattr(module, "attn_impl"):
            module.attn_impl = "sdpa"  # fused attention kernels train several times faster than the math path


def make_optimizer(model, lr: float, weight_decay: float) -> torch.optim.AdamW:
    fused = {"fused": True} if model.device.type == "cuda" else {}
    return torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.999), **fused)


def training_autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on the GPU; true fp32 on the CPU (bf16 matmuls crawl there)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


class TrainingStep:
    """One optimization step on a sampled batch: encoder, decoder, loss, backward, optimizer.

    compiled: run the encoder, the decoder pass and the loss through torch.compile. On an H100
    that halves a step (16 images x 8 prompts: 115 -> 61 ms, about 75 s of compiling first;
    `python -m bench.train_step_profile`): eager, the step is mostly small elementwise kernels
    (casts, adds, reductions over 128 prompt-sized copies of the image embedding) that inductor
    fuses. The compiled callables are separate objects, so validation keeps running the eager
    model (one image, no grad) without recompiling the training graphs.
    The phases are labelled for torch.profiler (bench.train_step_profile reads them); outside
    a profiler the labels cost microseconds.
    """

    def __init__(self, model, optimizer, compiled: bool):
        self.model, self.optimizer = model, optimizer
        self.autocast = training_autocast(model.device)
        self.encoder, self.decode, self.loss = model.image_encoder, decode_prompts, sam_loss
        if compiled:
            self.encoder, self.decode, self.loss = (torch.compile(f) for f in (self.encoder, self.decode, self.loss))

    def __call__(self, data: DeviceData, sampler: BatchSampler) -> tuple[torch.Tensor, dict]:
        model = self.model
        inputs = data.assemble(sampler.sample(), model.pixel_mean, model.pixel_std)
        with self.autocast:
            with record_function("encoder"):
                embeddings = self.encoder(inputs["images"])
            with record_function("decoder"):
                logits, iou_pred = self.decode(model, embeddings, inputs)
        with record_function("loss"):
            loss, parts = self.loss(logits, iou_pred, inputs["targets"])
        self.optimizer.zero_grad(set_to_none=True)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
        return loss, parts


def train(model, data: DeviceData, sampler: BatchSampler, heldout: ValidationSet, args, deadline: float,
          start: float, log) -> tuple[list[dict], dict]:
    """The training loop. Without --steps it measures its speed over CALIBRATE_STEPS and then fixes
    the step count so that the cosine schedule, the periodic validations and the final ones fit
    the budget; a safety stop ends it early if the estimate was wrong."""
    device = model.device
    train_step = TrainingStep(model, make_optimizer(model, args.lr, args.weight_decay), compiled=args.compile)
    calibrating = args.steps is None
    total = args.steps or 10**9  # set after calibration when the budget decides
    warmup = min(args.warmup, max(1, total // 5))
    final_reserve = 20.0
    # With --steps the schedule is fixed up front; otherwise validations start after calibration.
    next_val = time.monotonic() + args.val_every if not calibrating and args.val_every > 0 else None
    rows: list[dict] = []
    step, running, seen, t_log, s_log, t_cal = 0, None, 0, time.monotonic(), 0, 0.0
    train_start = time.monotonic()
    stopped_early = False
    while step < total:
        lr = learning_rate(step, total, warmup, args.lr)
        for group in train_step.optimizer.param_groups:
            group["lr"] = lr
        loss, parts = train_step(data, sampler)
        step += 1
        values = torch.stack([loss.detach(), parts["mask"], parts["single"], parts["iou"]])
        running = values if running is None else running + values  # summed on the device: no sync
        seen += 1

        if calibrating and step == CALIBRATE_STEPS[0]:
            _sync(device)
            t_cal = time.monotonic()
        if calibrating and step == CALIBRATE_STEPS[1]:
            _sync(device)
            rate = (CALIBRATE_STEPS[1] - CALIBRATE_STEPS[0]) / (time.monotonic() - t_cal)
            miou = validate(model, heldout)["point"]["miou"]
            rows.append({"step": step, "seconds": round(time.monotonic() - start, 1), "val_miou": miou})
            # Timed on a second pass: the first one also tunes kernels for the new shapes
            # (cudnn.benchmark), about 5x slower on an H100, and would make the plan reserve too much.
            t_val = time.monotonic()
            validate(model, heldout)
            val_seconds = time.monotonic() - t_val
            # The end validates the saved weights in true fp32 (math attention: about twice as slow)
            # on the held-out and embedded scenes, points and boxes (about 1.5 x one kind), and
            # on coco-mini's 21 larger photos; then it saves and plots.
            per_image = val_seconds / len(heldout.samples)
            final_reserve = 2 * per_image * (1.5 * (len(heldout.samples) + 16) + 2 * 21) + 15.0
            left = deadline - time.monotonic() - final_reserve
            periodic = int(left // args.val_every) if args.val_every > 0 else 0
            total = step + max(1, int((left - periodic * val_seconds) * rate * SCHEDULE_MARGIN))
            warmup = min(args.warmup, max(1, total // 5))
            next_val = time.monotonic() + args.val_every if args.val_every > 0 else None
            log(f"calibrated: {rate:.2f} steps/s, validation {val_seconds:.1f} s (held-out mIoU {miou:.3f}); "
                f"training {total} steps, to end near {deadline - final_reserve - start:.0f} s")

        if step % args.log_every == 0 or step == total:
            now = time.monotonic()
            mean = (running / seen).tolist()
            speed = (step - s_log) / (now - t_log)
            rows.append({"step": step, "seconds": round(now - start, 1), "lr": lr, "loss": mean[0], "mask": mean[1],
                         "single": mean[2], "iou": mean[3], "steps_per_s": round(speed, 3)})
            memory = f", {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB peak" if device.type == "cuda" else ""
            log(f"step {step}/{total if total < 10**9 else '?'} loss {mean[0]:.4f} (mask {mean[1]:.4f}, "
                f"single {mean[2]:.4f}, iou {mean[3]:.4f}) lr {lr:.2e} {speed:.2f} steps/s{memory}")
            running, seen, t_log, s_log = None, 0, now, step
        if next_val is not None and time.monotonic() >= next_val and step < total:
            result = validate(model, heldout)["point"]
            rows.append({"step": step, "seconds": round(time.monotonic() - start, 1), "val_miou": result["miou"]})
            log(f"validation at step {step}: held-out mIoU {result['miou']:.4f} ({result['count']} objects, centre point)")
            t_log, s_log = time.monotonic(), step  # keep validation time out of the speed figure
            next_val = time.monotonic() + args.val_every
        if calibrating and step > CALIBRATE_STEPS[1] and time.monotonic() > deadline - final_reserve:
            log(f"time budget reached at step {step} of {total}: stopping early")
            stopped_early = True
            break
    seconds = time.monotonic() - train_start
    return rows, {"steps": step, "planned_steps": total, "warmup": warmup, "seconds": seconds,
                  "stopped_early": stopped_early}


def finish(model, heldout: ValidationSet, embedded: ValidationSet, rows: list[dict], state: dict, data_info: dict,
           args, command: str, start: float, log) -> dict:
    """Save the weights, validate the saved file as users load it, write manifest, log and curve."""
    device = model.device
    cuda = device.type == "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.out / CHECKPOINT_NAME
    sha256 = save_checkpoint(model, ckpt_path)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # true fp32 for the reported figures
        torch.backends.cudnn.allow_tf32 = False
    trained = build_sam(MODEL_TYPE, checkpoint=ckpt_path, device=device, stages="fp32")
    final = {"step": state["steps"]}
    sets = [("heldout", heldout, ("point", "box")), ("scenes", embedded, ("point", "box"))]
    if not args.smoke:
        try:
            sets.append(("coco_mini", ValidationSet.of("coco-mini", load_dataset("coco-mini")), ("point",)))
        except DataNotFoundError as err:
            log(f"coco-mini not reported: {str(err).splitlines()[0]}")
    for name, vset, kinds in sets:
        for kind, result in validate(trained, vset, kinds).items():
            final[f"{name}_{kind}"] = result
            log(f"final {vset.name}, {kind}: mIoU {result['miou']:.4f} over {result['count']} objects")
    rows.append({"step": state["steps"], "seconds": round(time.monotonic() - start, 1),
                 "val_miou": final["heldout_point"]["miou"]})

    cfg = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    manifest = {
        "checkpoint": CHECKPOINT_NAME,
        "sha256": sha256,
        "bytes": ckpt_path.stat().st_size,
        "model_type": MODEL_TYPE,
        "layout": "official segment_anything state dict; fp16 tensors except " + ", ".join(FP32_KEYS),
        "command": command,
        "replay": f"{command} --steps {state['steps']}" if args.steps is None else command,
        "args": cfg,
        "steps": state["steps"],
        "planned_steps": state["planned_steps"],
        "stopped_early": state["stopped_early"],
        "train_seconds": round(state["seconds"], 1),
        "total_seconds": round(time.monotonic() - start, 1),
        "steps_per_s": round(state["steps"] / state["seconds"], 3),
        "images_seen": state["steps"] * args.batch,
        "data": {**data_info, "heldout": {"seed": HELDOUT_SEED, "images": len(heldout.samples)},
                 "embedded_eval": {"seed": 0, "images": len(embedded.samples), "used_for_training": False}},
        "training": {
            "init": f"synthetic_state_dict({MODEL_TYPE!r}, seed={args.seed}) (seeded random)",
            "optimizer": "AdamW", "lr": args.lr, "betas": [0.9, 0.999], "weight_decay": args.weight_decay,
            "warmup_steps": state["warmup"], "schedule": "linear warmup, cosine to 1% of lr", "grad_clip": 1.0,
            "precision": "bf16 autocast (prompt encoder fp32)" if cuda else "fp32",
            "compiled": args.compile,
            "loss": "min over the 3 multimask outputs of 20 focal (gamma 2, no alpha) + dice, on soft 256x256 "
                    "targets; the same on the single output; + MSE of the IoU head vs each output's IoU",
            "prompts": "per object: box (p 0.3, jitter 10% of side, at most 20 px), centre point (p 0.4), "
                       "uniform interior point (p 0.3); random horizontal/vertical flips"},
        "validation": {name: value for name, value in final.items() if name != "step"},
        "target_miou": TARGET_MIOU,
        "meets_target": final["heldout_point"]["miou"] >= TARGET_MIOU,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "smoke": args.smoke,
    }
    _write_text(args.out / "vit_tiny_trained.json", json.dumps(manifest, indent=2) + "\n")
    write_log_csv(args.out / "training_log.csv", rows)
    plot_curve(args.out / "training_curve.png", rows, final)
    log(f"wrote {ckpt_path} ({manifest['bytes'] / 2**20:.1f} MiB, sha256 {sha256[:12]}), manifest, log and curve; "
        f"{state['steps']} steps in {state['seconds']:.0f} s; held-out point mIoU {final['heldout_point']['miou']:.4f} "
        f"(target {TARGET_MIOU}: {'met' if manifest['meets_target'] else 'NOT met'})")
    return manifest


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
