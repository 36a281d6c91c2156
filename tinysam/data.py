"""The training data: generated scenes in a pool, batches of scenes and prompts sampled from it.

The pool is made once, up front, by forked worker processes writing into shared memory: every
scene pre-resized to the model's input frame (tinysam.frames), with its objects' low-res targets,
interior points and boxes. Training seeds (1000 + 10000 * seed + chunk, `train_seeds`) are disjoint from the embedded
evaluation set (generate_scenes(16, seed=0)) and the held-out validation set (seed 999).
A BatchSampler draws each step's scenes, flips and prompts on the host (seeded numpy); DeviceData
keeps the pool's images and targets on the training device and assembles a batch there.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
import time
from dataclasses import dataclass

import numpy as np
import torch

from parity.golden.data import centre_point, mask_box
from parity.golden.rle import decode_rle
from parity.golden.scenes import SCENES_VERSION, generate_scenes
from samfast.config import IMAGE_SIZE
from tinysam.frames import LONGEST_SIDE
from tinysam.targets import LOW_RES, flip_images, flip_targets, lowres_target

MAX_OBJECTS = 10  # generate_scenes draws 3..10 objects per scene
POINTS_PER_OBJECT = 24  # random interior points kept per object (slot 0 holds the centre point)
SCENES_PER_SEED = 20  # one generate_scenes call (one worker job) makes this many scenes


def train_seeds(seed: int, num_scenes: int) -> list[int]:
    """generate_scenes seeds of the training pool: >= 1000, so never 0 (evaluation) or 999 (held out)."""
    return [1000 + 10_000 * seed + k for k in range(math.ceil(num_scenes / SCENES_PER_SEED))]


def pool_array(shape: tuple[int, ...], dtype, shared: bool) -> np.ndarray:
    """A zeroed array; shared: in an anonymous MAP_SHARED mapping, so that processes forked after it
    write into the parent's pages and a pool made by workers is never copied back through pipes."""
    if not shared:
        return np.zeros(shape, dtype)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)


@dataclass
class Pool:
    """Training scenes pre-resized to the model's input frame. Images and targets become torch
    tensors on the training device; prompts stay on the host, where batches are sampled."""

    images: np.ndarray  # (N, 1024, 1024, 3) uint8, resized into the frame, zero outside [:h, :w]
    targets: np.ndarray  # (N, MAX_OBJECTS, 256, 256) uint8, covered fraction x 255
    counts: np.ndarray  # (N,) objects per scene
    sizes: np.ndarray  # (N, 4) original H, W and resized h, w
    points: np.ndarray  # (N, MAX_OBJECTS, 1 + POINTS_PER_OBJECT, 2) x, y original pixel indices; [.., 0] = centre
    boxes: np.ndarray  # (N, MAX_OBJECTS, 4) x0, y0, x1 (exclusive), y1, original pixels

    @classmethod
    def allocate(cls, n: int, shared: bool) -> Pool:
        def array(shape, dtype):
            return pool_array(shape, dtype, shared)

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
_FRAME = LONGEST_SIDE  # the input frame the pool's images are fitted to, likewise


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
        fitted, (h, w) = _FRAME.fit(image)
        pool.images[slot, :h, :w] = fitted
        pool.sizes[slot] = (*image.shape[:2], h, w)
    for ann in coco["annotations"]:
        slot = slot_of[ann["image_id"]]
        k = pool.counts[slot]
        if k >= MAX_OBJECTS:
            continue
        mask = decode_rle(ann["segmentation"])
        H, W, h, w = pool.sizes[slot]
        pool.targets[slot, k] = np.rint(lowres_target(mask, (h, w)) * 255).astype(np.uint8)
        ys, xs = np.nonzero(mask)
        pick = rng.integers(0, len(xs), POINTS_PER_OBJECT)
        pool.points[slot, k, 0] = centre_point(mask)
        pool.points[slot, k, 1:, 0], pool.points[slot, k, 1:, 1] = xs[pick], ys[pick]
        pool.boxes[slot, k] = mask_box(mask)
        pool.counts[slot] = k + 1
    return count, len(coco["annotations"])


def build_pool(num_scenes: int, seed: int, workers: int, log=print, while_waiting=None,
               frame=LONGEST_SIDE) -> tuple[Pool, dict, object]:
    """num_scenes training scenes from train_seeds(seed), fitted to `frame` (tinysam.frames), made
    by `workers` forked processes (inline when workers <= 1). while_waiting() runs in this process
    meanwhile (after the fork, so it may start CUDA). Returns the pool, what the manifest records
    about it, and while_waiting's result."""
    global _POOL, _FRAME
    start = time.monotonic()
    seeds = train_seeds(seed, num_scenes)
    jobs = [(k * SCENES_PER_SEED, min(SCENES_PER_SEED, num_scenes - k * SCENES_PER_SEED), s) for k, s in enumerate(seeds)]
    _POOL, _FRAME = Pool.allocate(num_scenes, shared=workers > 1), frame
    waited = None
    try:
        if workers > 1:
            # One torch thread per worker: a frame that resizes with torch (SAM 2's) would otherwise
            # run workers x cores threads.
            with multiprocessing.get_context("fork").Pool(workers, torch.set_num_threads, (1,)) as procs:
                pending = procs.map_async(_fill_chunk, jobs, chunksize=1)
                waited = while_waiting() if while_waiting else None
                results = pending.get()
        else:
            results = [_fill_chunk(job) for job in jobs]
            waited = while_waiting() if while_waiting else None
        pool = _POOL
    finally:
        _POOL, _FRAME = None, LONGEST_SIDE
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
    num_points: int  # point prompts (is_box False); with group_kinds they are the first num_points


class BatchSampler:
    """Scenes in shuffled passes over the pool, random flips, `prompts` objects per scene (all of
    them, some twice, when a scene has fewer), and a random prompt per object.

    group_kinds: for a decoder that takes the two kinds in separate passes (SAM 2's:
    tinysam.forward.decode_sam2_prompts), every batch has the same number of boxes,
    round(p_box x prompts), points first. A fixed split keeps that decoder's shapes the same from
    step to step (torch.compile does not recompile; cuDNN tunes once); each prompt is still a box
    with probability p_box. The draws are the same as without it (same scenes, flips, objects and
    points): only which prompts are boxes, and their order, differ.
    """

    def __init__(self, pool: Pool, batch: int, prompts: int, seed: int,
                 p_box: float = 0.3, p_centre: float = 0.4, flips: bool = True, group_kinds: bool = False):
        self.pool, self.batch, self.prompts = pool, batch, prompts
        self.p_box, self.p_centre, self.flips, self.group_kinds = p_box, p_centre, flips, group_kinds
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
        if self.group_kinds:  # the round(p_box x P) lowest draws are boxes: a fixed count, each prompt as likely
            is_box = np.zeros(len(objects), dtype=bool)
            is_box[np.argsort(kind, kind="stable")[: round(self.p_box * len(objects))]] = True
        else:
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
        prompts = [image_index, objects, is_box, points.astype(np.float32), boxes.astype(np.float32)]
        if self.group_kinds:  # points first
            order = np.argsort(is_box, kind="stable")
            prompts = [array[order] for array in prompts]
        return Batch(scenes, hflip, vflip, *prompts, num_points=int(len(is_box) - is_box.sum()))


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

    def assemble(self, batch: Batch, pixel_mean: torch.Tensor, pixel_std: torch.Tensor) -> dict[str, torch.Tensor | int]:
        scenes = self._put(batch.scenes)
        hflip, vflip = self._put(batch.hflip), self._put(batch.vflip)
        image_index = self._put(batch.image_index)
        sizes = self.sizes[scenes]
        images = flip_images(self.images[scenes].permute(0, 3, 1, 2), sizes, hflip, vflip)
        # SAM normalises, then zero-pads (Sam.preprocess): padding is 0 after normalisation (a
        # stretched SAM 2 image has none: its valid region is the whole square).
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
            "num_points": batch.num_points,  # a host int, for decoders that split the kinds
        }
