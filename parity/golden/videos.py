"""Generated video clips with exact per-frame instance masks: the video task's data, no download.

Each clip is a textured background with four textured objects drawn with the shapes of the
generated scenes (parity.golden.scenes), each with a scripted motion that tests one thing a
tracker must survive, over `frames` frames:

    "occluded"   drifts right across the middle
    "occluder"   sweeps left over it, hiding much of it for the middle frames (drawn on top), and grows
                 to 1.6 times its size on the way (a change of scale)
    "wanderer"   leaves through the right edge, is absent for a few frames, comes back

Three objects, not more: each costs one tracking step per frame, and the gate runs on 2 CPU cores.

Masks are what stays visible after occlusion (scenes' _visible), so they are exact and never
overlap; an object below scenes.MIN_VISIBLE_AREA pixels on a frame is absent there (empty mask).
Same determinism as the scenes: random numbers only from Generator(PCG64).random(), vertices
rounded to whole pixels before filling (module docstring of parity.golden.scenes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from parity.golden.scenes import (
    MIN_VISIBLE_AREA,
    TEXTURES,
    _fill_polygon,
    _shape,
    _texture,
    _uniform,
    _visible,
)

VIDEOS_VERSION = "videos-v1"
ROLES = ("occluded", "occluder", "wanderer")  # drawing order: later ones occlude earlier ones
DEFAULT_FRAMES, DEFAULT_HEIGHT, DEFAULT_WIDTH = 8, 240, 320


@dataclass(frozen=True)
class Clip:
    """One video: frames (T, H, W, 3) uint8 RGB, masks (objects, T, H, W) bool in ROLES order."""

    video_id: int
    frames: np.ndarray
    masks: np.ndarray

    @property
    def object_ids(self) -> list[int]:
        return list(range(1, len(self.masks) + 1))  # 1-based, as the objects are given to the tracker

    def visible(self, obj: int, frame: int) -> bool:
        return bool(self.masks[obj, frame].any())


def generate_clip(video_id: int, *, seed: int = 0, frames: int = DEFAULT_FRAMES, height: int = DEFAULT_HEIGHT,
                  width: int = DEFAULT_WIDTH) -> Clip:
    """Clip `video_id` of seed `seed`: the same bits on every machine."""
    rng = np.random.Generator(np.random.PCG64([seed, video_id]))
    ys, xs = np.mgrid[0:height, 0:width] + 0.5
    background = _texture(rng, ys, xs, contrast=60.0, kinds=TEXTURES[1:])
    short = min(height, width)
    outlines = [_outline(rng, height, width, _uniform(rng, 0.09, 0.13) * short) for _ in ROLES]
    # Each object's texture comes from its own generator, restarted every frame: the same look throughout.
    texture_seeds = [int(rng.random() * 2**32) for _ in ROLES]
    paths = _paths(rng, frames, height, width, short)
    all_masks = np.zeros((len(ROLES), frames, height, width), dtype=bool)
    video = np.empty((frames, height, width, 3), dtype=np.uint8)
    for t in range(frames):
        drawn = [_fill_polygon(np.rint(outline * scale + centre), height, width)
                 for outline, (centre, scale) in zip(outlines, (path[t] for path in paths))]
        visible = [m if np.count_nonzero(m) >= MIN_VISIBLE_AREA else np.zeros_like(m) for m in _visible(drawn, ys.shape)]
        image = background.copy()
        for obj, mask in enumerate(visible):
            if mask.any():
                local = np.random.Generator(np.random.PCG64(texture_seeds[obj]))
                centre = paths[obj][t][0]
                # texture in the object's own coordinates, so it moves with the object
                image[mask] = _texture(local, ys[mask] - centre[1], xs[mask] - centre[0], contrast=160.0)
            all_masks[obj, t] = mask
        video[t] = np.floor(np.clip(image, 0, 255)).astype(np.uint8)
    return Clip(video_id, video, all_masks)


def _outline(rng: np.random.Generator, height: int, width: int, radius: float) -> np.ndarray:
    """A scenes shape's vertices around (0, 0), scaled to `radius` (float: rounded after each frame's move)."""
    _, vertices = _shape(rng, height, width)
    points = vertices - vertices.mean(axis=0)
    extent = np.sqrt((points * points).sum(axis=1)).max()
    return points * (radius / max(extent, 1.0))


def _paths(rng: np.random.Generator, frames: int, height: int, width: int, short: int) -> list[list[tuple]]:
    """Per role, per frame: (centre (x, y), scale)."""

    def jitter() -> float:  # where a clip's objects run varies by a few percent of the frame
        return _uniform(rng, -0.04, 0.04)

    u = np.linspace(0.0, 1.0, frames)
    row = (0.42 + jitter()) * height
    occluded = [(np.array([(0.35 + 0.15 * s) * width, row]), 1.0) for s in u]
    # the occluder passes over the occluded object's path near the middle frame
    occluder = [(np.array([(0.75 - 0.5 * s) * width, row + 0.05 * height]), 1.0 + 0.6 * s) for s in u]
    # the wanderer goes out through the right edge (its centre a full radius past it) and back
    out = 1.0 + 0.35 * short / width
    swing = np.minimum(u, 1.0 - u) * 2.0  # 0 -> 1 -> 0
    wanderer = [(np.array([(0.6 + (out - 0.6) * min(1.0, 1.2 * s)) * width, (0.15 + jitter()) * height]), 1.0)
                for s in swing]
    return [occluded, occluder, wanderer]


def generate_clips(count: int, *, seed: int = 0, frames: int = DEFAULT_FRAMES) -> list[Clip]:
    return [generate_clip(video_id, seed=seed, frames=frames) for video_id in range(1, count + 1)]


def clip_fingerprint(clips: list[Clip]) -> str:
    """sha256 of every frame and mask: a golden made on other clips is refused."""
    digest = hashlib.sha256(VIDEOS_VERSION.encode())
    for clip in clips:
        digest.update(np.ascontiguousarray(clip.frames).tobytes())
        digest.update(np.packbits(clip.masks).tobytes())
    return digest.hexdigest()
