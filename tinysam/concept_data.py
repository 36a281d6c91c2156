"""The concept trainer's data: generated scenes as SAM 3 sees them, with every category's instances.

Each scene (parity.golden.scenes, 320..640 px, 3..10 objects of five categories) is stretched to the
model's square input as Sam3Processor stretches it, and each object keeps its category, its tight box
(centre x, centre y, width, height in [0, 1], SAM 3's box format) and its mask at the resolution of
the model's mask logits as area fractions (the share of each cell the object covers). The pool is made
once, up front, by forked workers, one generate_scenes call of SCENES_PER_SEED scenes per job, on the
training seeds of tinysam.data (disjoint from the embedded and held-out sets).
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from parity.golden.data import mask_box
from parity.golden.rle import decode_rle
from parity.golden.scenes import CATEGORIES, generate_scenes
from tinysam.data import MAX_OBJECTS, SCENES_PER_SEED, train_seeds

# The phrases the model learns: every scene category's name, as the concept gate asks them
PHRASES = tuple(CATEGORIES)


@dataclass
class ConceptPool:
    images: torch.Tensor  # (N, 3, S, S) uint8, stretched to the model's input
    labels: torch.Tensor  # (N, MAX_OBJECTS) long: the object's phrase index, -1 for an empty slot
    boxes: torch.Tensor  # (N, MAX_OBJECTS, 4) cxcywh in [0, 1]
    masks: torch.Tensor  # (N, MAX_OBJECTS, M, M) float16 area fractions

    def __len__(self) -> int:
        return self.images.shape[0]

    def to(self, device: torch.device) -> ConceptPool:
        return ConceptPool(*(t.to(device) for t in (self.images, self.labels, self.boxes, self.masks)))


def scene_arrays(image: np.ndarray, objects: list[tuple[int, np.ndarray]], size: int, mask_size: int):
    """One scene (H x W x 3 uint8, (category id, H x W mask) per object) as the pool's rows."""
    height, width = image.shape[:2]
    pixels = v2.functional.resize(torch.from_numpy(image).permute(2, 0, 1), [size, size])
    labels = torch.full((MAX_OBJECTS,), -1, dtype=torch.long)
    boxes = torch.zeros(MAX_OBJECTS, 4)
    masks = torch.zeros(MAX_OBJECTS, mask_size, mask_size, dtype=torch.float16)
    for slot, (category_id, mask) in enumerate(objects[:MAX_OBJECTS]):
        x0, y0, x1, y1 = mask_box(mask)
        labels[slot] = category_id - 1
        boxes[slot] = torch.tensor([(x0 + x1) / 2 / width, (y0 + y1) / 2 / height, (x1 - x0) / width, (y1 - y0) / height])
        cells = F.interpolate(torch.from_numpy(mask).float()[None, None], (mask_size, mask_size), mode="area")
        masks[slot] = cells[0, 0].half()
    return pixels, labels, boxes, masks


def _scenes_of_seed(job: tuple[int, int, int, int]) -> list[tuple]:
    seed, count, size, mask_size = job
    coco, images = generate_scenes(count, seed=seed)
    by_image: dict[int, list] = {}
    for annotation in coco["annotations"]:
        by_image.setdefault(annotation["image_id"], []).append((annotation["category_id"],
                                                                 decode_rle(annotation["segmentation"])))
    return [scene_arrays(images[info["file_name"]], by_image.get(info["id"], []), size, mask_size)
            for info in coco["images"]]


def build_concept_pool(num_scenes: int, seed: int, size: int, mask_size: int, workers: int) -> ConceptPool:
    """num_scenes training scenes (rounded up to whole generate_scenes calls) at `size` px, masks at mask_size."""
    jobs = [(s, min(SCENES_PER_SEED, num_scenes), size, mask_size) for s in train_seeds(seed, num_scenes)]
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            chunks = pool.map(_scenes_of_seed, jobs)
    else:
        chunks = [_scenes_of_seed(job) for job in jobs]
    rows = [row for chunk in chunks for row in chunk][:num_scenes]
    return ConceptPool(*(torch.stack(column) for column in zip(*rows)))
