"""The masks box NMS dropped at a near tie: what a stage may keep in place of the golden's mask.

Box NMS keeps the higher-scored of two masks whose boxes overlap above box_nms_thresh. When their
predicted IoUs lie within the stage's score tolerance of each other, rounding alone may swap which one
is kept: the golden then holds one mask of the pair and the stage the other, and the check would see a
mask matched at a lower IoU (or one lost and one new) that the stage did not get wrong. So the check's
generator also returns, per image, every candidate NMS dropped in favour of a kept mask scored no more
than the tolerance above it (its *alternates*), and matching (parity.tasks.amg.matching) may pair a
golden mask with one of them, counted as swapped at NMS.

Covered: box NMS within a crop. The NMS between crops and min_mask_region_area's clean-up run on the
kept masks only.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torchvision.ops import batched_nms, box_iou

from samfast import SamAutomaticMaskGenerator


def alternates_generator(model: torch.nn.Module, score_tolerance: float, **kwargs) -> SamAutomaticMaskGenerator:
    """The generator samfast builds for `model` (its family's: SAM 1's or SAM 2's), records unchanged, that
    also keeps each image's alternates: `.alternates`, one list of records per image of the last
    generate or generate_batch call, in the records' format."""
    # the family's class, as SamAutomaticMaskGenerator(model) would choose it (samfast.families)
    family = type(SamAutomaticMaskGenerator.__new__(SamAutomaticMaskGenerator, model))
    return _with_alternates(family)(model, score_tolerance, **kwargs)


@functools.cache
def _with_alternates(family: type) -> type:
    return type(f"{family.__name__}WithAlternates", (_KeepsAlternates, family), {})


class _KeepsAlternates:
    """Mixed in before a family's generator class (alternates_generator)."""

    def __init__(self, model: torch.nn.Module, score_tolerance: float, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self.score_tolerance = score_tolerance
        self.alternates: list[list[dict]] = []
        self._dropped = []  # the current image's alternates per crop (samfast's _Kept), until its records

    def generate_batch(self, images: list[np.ndarray]) -> list[list[dict]]:
        self.alternates, self._dropped = [], []
        return super().generate_batch(images)

    def _filter_crop(self, c, crop, logits, iou, image_size):
        index, stability, boxes = self._candidates(crop, logits, iou, image_size)
        scores = iou[index]
        keep = batched_nms(boxes.float(), scores, torch.zeros_like(index), self.box_nms_thresh)  # by descending score
        dropped = torch.ones(len(index), dtype=torch.bool, device=index.device)
        dropped[keep] = False
        dropped = torch.nonzero(dropped)[:, 0]
        if len(dropped):
            # greedy NMS dropped each box for the first kept box, in score order, that overlaps it above the threshold
            suppressor = (box_iou(boxes[dropped].float(), boxes[keep].float()) > self.box_nms_thresh).int().argmax(dim=1)
            near = dropped[scores[dropped] >= scores[keep][suppressor] - self.score_tolerance]
            if len(near):
                self._dropped.append(self._kept(c, crop, index[near], stability[near], boxes[near], iou))
        return self._kept(c, crop, index[keep], stability[keep], boxes[keep], iou)

    def _records(self, kept, crops, logits, image_size) -> list[dict]:
        # called once per image, after _filter_crop for each of its crops
        records_of = super()._records
        records = records_of(kept, crops, logits, image_size)
        self.alternates.append([r for d in self._dropped for r in records_of([d], crops, logits, image_size)])
        self._dropped = []
        return records
