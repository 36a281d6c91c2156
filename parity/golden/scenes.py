"""Generated COCO-format scenes: exact instance masks with no download, the same bits on every machine.

Each scene is a textured background with 3 to 10 textured objects (ellipses, rectangles,
polygons, stars, blobs) from a few pixels to a third of the image, drawn in order so later
objects occlude earlier ones. Instance masks are what stays visible after occlusion, so they are
exact and never overlap.

Why the output is identical everywhere for a seed:
- random numbers come only from Generator(PCG64(seed)).random(), whose float stream numpy keeps
  stable; other distribution methods (integers, normal) may change algorithm between releases;
- every shape is a polygon whose vertices are rounded to whole pixels before filling, so a
  last-ulp difference in a platform's sin/cos cannot move a pixel, and filling uses only
  comparisons and IEEE + - * / on those integers (no drawing library whose rasteriser may change).
"""

from __future__ import annotations

import numpy as np
from pycocotools import mask as mask_utils

SCENES_VERSION = "scenes-v1"
CATEGORIES = ["ellipse", "rectangle", "polygon", "star", "blob"]  # category id = index + 1
TEXTURES = ["flat", "stripes", "noise", "gradient"]
MIN_VISIBLE_AREA = 20  # pixels; an object occluded below this is dropped before painting


def generate_scenes(
    num_images: int, *, seed: int = 0, size_range: tuple[int, int] = (320, 640)
) -> tuple[dict, dict[str, np.ndarray]]:
    """num_images scenes as (COCO dataset dict, {file_name: uint8 HxWx3 RGB image}).

    Height and width are drawn independently in size_range (inclusive). Segmentations are
    compressed RLE with 'counts' as str, so the dict is JSON-serialisable.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    coco: dict = {
        "info": {"description": "samfast generated scenes", "version": SCENES_VERSION,
                 "seed": seed, "size_range": list(size_range)},
        "images": [],
        "annotations": [],
        "categories": [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(CATEGORIES)],
    }
    images = {}
    for image_id in range(1, num_images + 1):
        height, width = _integer(rng, *size_range), _integer(rng, *size_range)
        image, objects = _scene(rng, height, width)
        file_name = f"scene_{image_id:04d}.png"
        images[file_name] = image
        coco["images"].append({"id": image_id, "file_name": file_name, "height": height, "width": width})
        for category_id, mask in objects:
            rle = mask_utils.encode(np.asfortranarray(mask, dtype=np.uint8))
            coco["annotations"].append({
                "id": len(coco["annotations"]) + 1,
                "image_id": image_id,
                "category_id": category_id,
                "segmentation": {"size": rle["size"], "counts": rle["counts"].decode("ascii")},
                "area": int(mask_utils.area(rle)),
                "bbox": mask_utils.toBbox(rle).tolist(),
                "iscrowd": 0,
            })
    return coco, images


def _uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return low + (high - low) * rng.random()


def _integer(rng: np.random.Generator, low: int, high: int) -> int:
    """Uniform integer in [low, high], built on random() for stream stability (module docstring)."""
    return low + int(rng.random() * (high - low + 1))


def _scene(rng: np.random.Generator, height: int, width: int) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    ys, xs = np.mgrid[0:height, 0:width] + 0.5  # pixel centres
    # A low-contrast background that is never flat, so no model can find objects by colour alone.
    image = _texture(rng, ys, xs, contrast=60.0, kinds=TEXTURES[1:])
    shapes = [_shape(rng, height, width) for _ in range(_integer(rng, 3, 10))]
    drawn = [(category_id, _fill_polygon(vertices, height, width)) for category_id, vertices in shapes]
    kept = [obj for obj, visible in zip(drawn, _visible([m for _, m in drawn], ys.shape))
            if np.count_nonzero(visible) >= MIN_VISIBLE_AREA]
    # Dropping an object only uncovers pixels of the others, so every kept one stays above the minimum.
    visible = _visible([m for _, m in kept], ys.shape)
    for mask in visible:
        image[mask] = _texture(rng, ys[mask], xs[mask], contrast=160.0)
    return np.floor(np.clip(image, 0, 255)).astype(np.uint8), [(c, m) for (c, _), m in zip(kept, visible)]


def _visible(drawn: list[np.ndarray], shape: tuple[int, int]) -> list[np.ndarray]:
    """What remains of each mask once every later mask is painted over it."""
    covered = np.zeros(shape, dtype=bool)
    visible = []
    for mask in reversed(drawn):
        visible.append(mask & ~covered)
        covered |= mask
    return visible[::-1]


def _texture(
    rng: np.random.Generator, ys: np.ndarray, xs: np.ndarray, contrast: float, kinds: list[str] = TEXTURES
) -> np.ndarray:
    """Float RGB colours (shape ys.shape + (3,)) at pixel centres ys, xs: a texture of a random kind
    around a random colour, contrast setting its spread. Objects pass only their own pixels, which
    keeps generation fast and stretches a gradient across the object rather than the image."""
    kind = kinds[_integer(rng, 0, len(kinds) - 1)]
    base = rng.random(3) * 255.0
    other = base + (rng.random(3) - 0.5) * 2.0 * contrast
    direction = rng.random(2) - 0.5
    # Plain IEEE ops (no BLAS dot, which may fuse multiply-adds; no cos/sin): this feeds pixel values.
    direction /= np.sqrt(direction[0] * direction[0] + direction[1] * direction[1])
    along = xs * direction[0] + ys * direction[1]
    if kind == "flat":
        return np.broadcast_to(base, ys.shape + (3,)).copy()
    if kind == "stripes":
        period = _uniform(rng, 4.0, 24.0)
        odd = (np.floor(along / period) % 2 == 1)[..., None]
        return np.where(odd, other, base)
    if kind == "noise":
        return base + (rng.random(ys.shape + (3,)) - 0.5) * contrast
    t = ((along - along.min()) / np.ptp(along))[..., None]  # gradient
    return base + (other - base) * t


def _shape(rng: np.random.Generator, height: int, width: int) -> tuple[int, np.ndarray]:
    """A random shape as (category_id, integer polygon vertices (N, 2) as x, y)."""
    category = _integer(rng, 0, len(CATEGORIES) - 1)
    name = CATEGORIES[category]
    centre = np.array([_uniform(rng, 0, width), _uniform(rng, 0, height)])
    # Log-uniform size: as many small objects as large ones, like COCO.
    radius = 6.0 * (0.35 * min(height, width) / 6.0) ** rng.random()
    rotation = _uniform(rng, 0.0, 2.0 * np.pi)
    if name in ("ellipse", "blob"):
        angles = np.arange(48) * (2.0 * np.pi / 48)
        if name == "ellipse":
            axes = np.array([radius, radius * _uniform(rng, 0.35, 1.0)])
            points = _polar(angles, np.ones_like(angles)) * axes
        else:
            # Radius modulated by a few low harmonics, small enough to stay star-shaped about the centre.
            wobble = sum(_uniform(rng, 0.0, 0.18) * np.cos(k * angles + _uniform(rng, 0.0, 2.0 * np.pi))
                         for k in (2, 3, 4))
            points = _polar(angles, radius * (1.0 + wobble))
    elif name == "rectangle":
        half = np.array([radius, radius * _uniform(rng, 0.2, 1.0)])
        points = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * half
    elif name == "polygon":
        corners = _integer(rng, 3, 8)
        angles = (np.arange(corners) + (rng.random(corners) - 0.5) * 0.6) * (2.0 * np.pi / corners)
        points = _polar(angles, radius * (0.6 + 0.4 * rng.random(corners)))
    else:  # star
        tips = _integer(rng, 5, 8)
        angles = np.arange(2 * tips) * (np.pi / tips)
        points = _polar(angles, np.where(np.arange(2 * tips) % 2 == 0, radius, radius * _uniform(rng, 0.35, 0.6)))
    turn = np.array([[np.cos(rotation), -np.sin(rotation)], [np.sin(rotation), np.cos(rotation)]])
    return category + 1, np.rint(points @ turn.T + centre)


def _polar(angles: np.ndarray, radii: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(angles), np.sin(angles)], axis=1) * np.asarray(radii)[:, None]


def _fill_polygon(vertices: np.ndarray, height: int, width: int) -> np.ndarray:
    """Pixels whose centre lies inside the polygon (even-odd rule), clipped to the image.

    Vertices are whole numbers and pixel centres half-integers, so a centre never sits exactly
    on a vertex's row and the crossing test has no ambiguous case.
    """
    mask = np.zeros((height, width), dtype=bool)
    x0, y0 = np.maximum(vertices.min(axis=0), 0).astype(int)
    x1, y1 = np.minimum(vertices.max(axis=0), [width, height]).astype(int)
    if x0 >= x1 or y0 >= y1:
        return mask
    row_centres = (np.arange(y0, y1) + 0.5)[:, None]
    col_centres = np.arange(x0, x1) + 0.5
    (px, py), (qx, qy) = vertices.T, np.roll(vertices, -1, axis=0).T
    crosses = (py <= row_centres) != (qy <= row_centres)  # (rows, edges)
    with np.errstate(divide="ignore", invalid="ignore"):  # horizontal edges never cross; masked below
        at_x = px + (row_centres - py) * (qx - px) / (qy - py)
    at_x = np.where(crosses, at_x, np.inf)
    crossings_left = np.count_nonzero(at_x[:, :, None] < col_centres, axis=1)
    mask[y0:y1, x0:x1] = crossings_left % 2 == 1
    return mask
