"""The tracking run's data: generated clips (parity.golden.videos) prepared as the tracker reads
them, and the windows of them that each training step tracks.

The pool is made once, up front, by forked worker processes writing into shared memory: each clip's frames through
samfast's own video reader at the training input size (samfast.video.frames.load_video_frames, the
bits init_state would make), each object's per-frame target at the decoder's low resolution (the
covered fraction of each cell), whether the object is in the frame, and its prompt points (the
centre point the video gate clicks, parity.golden.data.centre_point, then random interior pixels).
Training seeds (TRAIN_SEED_BASE + seed) are disjoint from the video gate's clips (seed 0) and the
held-out clips (HELDOUT_SEED).

A window is WINDOW frames of one clip at a random stride (1 or 2), forwards or backwards, flipped
left-right at random; its objects are those present on its first frame, each clicked there once,
as the gate prompts. Every object of a step's windows is tracked in one batch.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from parity.golden.data import centre_point
from parity.golden.videos import DEFAULT_HEIGHT, DEFAULT_WIDTH, ROLES, generate_clip
from samfast.video.frames import load_video_frames
from tinysam.data import pool_array

CLIP_FRAMES = 16  # frames per generated clip: a window at stride 2 spans all of them
WINDOW = 8  # frames per tracked window: the prompted one and 7 tracked, which fill sam2's 7 memory slots
POINTS_PER_OBJECT = 8  # random interior points per object and frame (slot 0 holds the centre point)
TRAIN_SEED_BASE = 5000  # clip seeds of training: TRAIN_SEED_BASE + --seed
HELDOUT_SEED = 999  # the held-out clips' seed (the gate's are seed 0)
MASK_SCALE = 4  # the decoder's low-resolution masks are the input size / 4


@dataclass
class ClipPool:
    """Clips as the tracker reads them. frames: (N, T, 3, S, S) float16, normalized; targets:
    (N, O, T, S/4, S/4) float16 covered fractions; present: (N, O, T) bool; points: (N, O, T,
    1 + POINTS_PER_OBJECT, 2) float32 x, y pixel indices in the clip's frames, of width x height."""

    frames: np.ndarray
    targets: np.ndarray
    present: np.ndarray
    points: np.ndarray
    size: int
    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT


_POOL: ClipPool | None = None  # set in the parent before forking; the workers inherit it


def _fill_clip(job: tuple[int, int, int]) -> None:
    """Clip `video_id` of `seed` into pool slot `slot` (a worker's job)."""
    slot, video_id, seed = job
    pool = _POOL
    clip = generate_clip(video_id, seed=seed, frames=CLIP_FRAMES)
    frames, _, _ = load_video_frames(list(clip.frames), pool.size, offload_video_to_cpu=True,
                                     compute_device=torch.device("cpu"))
    pool.frames[slot] = frames.half().numpy()
    low_res = (pool.size // MASK_SCALE, pool.size // MASK_SCALE)
    pool.targets[slot] = F.adaptive_avg_pool2d(torch.from_numpy(clip.masks).float(), low_res).half().numpy()
    pool.present[slot] = clip.masks.any(axis=(2, 3))
    rng = np.random.Generator(np.random.PCG64([seed, video_id, 1]))  # interior points: a stream apart from the clip's
    for o, t in zip(*np.nonzero(pool.present[slot])):
        rows, cols = np.nonzero(clip.masks[o, t])
        pick = rng.integers(0, rows.size, POINTS_PER_OBJECT)
        pool.points[slot, o, t, 0] = centre_point(clip.masks[o, t])
        pool.points[slot, o, t, 1:] = np.stack([cols[pick], rows[pick]], axis=1)


def build_clip_pool(count: int, seed: int, size: int, workers: int, log) -> ClipPool:
    """count training clips at input size `size`, made by `workers` forked processes writing into
    shared memory (fork before anything starts CUDA in this process)."""
    global _POOL
    start = time.monotonic()
    shared = workers > 1

    def array(shape, dtype):
        return pool_array(shape, dtype, shared)

    objects, low = len(ROLES), size // MASK_SCALE
    _POOL = ClipPool(frames=array((count, CLIP_FRAMES, 3, size, size), np.float16),
                     targets=array((count, objects, CLIP_FRAMES, low, low), np.float16),
                     present=array((count, objects, CLIP_FRAMES), np.bool_),
                     points=array((count, objects, CLIP_FRAMES, 1 + POINTS_PER_OBJECT, 2), np.float32), size=size)
    jobs = [(slot, slot + 1, TRAIN_SEED_BASE + seed) for slot in range(count)]
    try:
        if shared:
            # one torch thread per worker: the resizes would otherwise run workers x cores threads
            with multiprocessing.get_context("fork").Pool(workers, torch.set_num_threads, (1,)) as procs:
                procs.map(_fill_clip, jobs, chunksize=max(1, count // (4 * workers)))
        else:
            for job in jobs:
                _fill_clip(job)
        pool = _POOL
    finally:
        _POOL = None
    log(f"clip pool: {count} clips of {CLIP_FRAMES} frames at {size}x{size}, {objects} objects each, "
        f"seed {TRAIN_SEED_BASE + seed}, in {time.monotonic() - start:.1f} s with {max(workers, 1)} worker(s) "
        f"({pool.frames.nbytes / 2**30:.2f} GiB of frames)")
    return pool


@dataclass
class WindowBatch:
    """One step's windows. frames (B, WINDOW, 3, S, S) on the device; per tracked object (N of them,
    grouped by window): window (N,) its window's index, points (N, 1, 2) its click on the first
    frame in input pixels, targets (N, WINDOW, S/4, S/4), present (N, WINDOW)."""

    frames: torch.Tensor
    window: torch.Tensor
    points: torch.Tensor
    targets: torch.Tensor
    present: torch.Tensor


class WindowSampler:
    """Samples each step's windows on the host (seeded numpy) and gathers them from the pool's device copy."""

    def __init__(self, pool: ClipPool, windows: int, seed: int, device: torch.device, centre_share: float = 0.5):
        self.pool, self.windows, self.device = pool, windows, device
        self.centre_share = centre_share  # the share of clicks on the centre point, as the gate clicks
        self.rng = np.random.Generator(np.random.PCG64([seed, 7]))
        self.frames = torch.from_numpy(pool.frames).to(device)
        self.targets = torch.from_numpy(pool.targets).to(device)

    def sample(self) -> WindowBatch:
        rng, pool = self.rng, self.pool
        frame_rows, target_rows, present_rows, points, window_of = [], [], [], [], []
        while len(frame_rows) < self.windows:
            clip = int(rng.integers(len(pool.frames)))
            stride = int(rng.integers(1, 3))
            span = (WINDOW - 1) * stride + 1
            start = int(rng.integers(0, CLIP_FRAMES - span + 1))
            times = np.arange(start, start + span, stride)
            if rng.random() < 0.5:
                times = times[::-1]
            objects = np.nonzero(pool.present[clip, :, times[0]])[0]
            if objects.size == 0:
                continue
            flip = bool(rng.random() < 0.5)
            first = pool.points[clip, objects, times[0]]  # (n, 1 + K, 2)
            slot = np.where(rng.random(objects.size) < self.centre_share, 0,
                            rng.integers(1, 1 + POINTS_PER_OBJECT, objects.size))
            xy = first[np.arange(objects.size), slot]
            if flip:
                xy = np.stack([pool.width - 1 - xy[:, 0], xy[:, 1]], axis=1)
            # as the predictor scales a click (add_new_points_or_box): by the input size over the video's
            points.append(xy * (pool.size / np.array([pool.width, pool.height], dtype=np.float32)))
            frame_rows.append((clip, times, flip))
            target_rows.append((clip, objects, times, flip))
            present_rows.append(pool.present[clip][np.ix_(objects, times)])
            window_of.extend([len(frame_rows) - 1] * objects.size)
        frames = torch.stack([self._flipped(self.frames[clip, torch.from_numpy(times.copy())], flip)
                              for clip, times, flip in frame_rows])
        targets = torch.cat([self._flipped(self.targets[clip][torch.from_numpy(objects)][:, torch.from_numpy(times.copy())], flip)
                             for clip, objects, times, flip in target_rows])
        device = self.device
        return WindowBatch(
            frames=frames.float(),
            window=torch.tensor(window_of, device=device),
            points=torch.from_numpy(np.concatenate(points)).float()[:, None].to(device),
            targets=targets.float(),
            present=torch.from_numpy(np.concatenate(present_rows)).to(device),
        )

    @staticmethod
    def _flipped(images: torch.Tensor, flip: bool) -> torch.Tensor:
        return images.flip(-1) if flip else images
