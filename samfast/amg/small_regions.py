"""min_mask_region_area: small holes filled and small islands removed, then NMS again (the reference's
SamAutomaticMaskGenerator.postprocess_small_regions, without opencv).

Connected components are 8-connected, as opencv's connectedComponentsWithStats(mask, 8) finds them,
and numbered in the same raster order (scipy.ndimage.label), so "keep the largest island when every
island is small" picks the same one. Like the reference this runs on the CPU, one mask at a time:
it is a post-processing of the few masks that survived every filter.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage
from torchvision.ops import batched_nms

from samfast.amg.masks import mask_boxes

EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


def remove_small_regions(mask: np.ndarray, area_thresh: float, mode: str) -> tuple[np.ndarray, bool]:
    """(mask, changed): mode "holes" fills background regions smaller than area_thresh, "islands"
    removes foreground regions smaller than it (keeping the largest if all are)."""
    if mode not in ("holes", "islands"):
        raise ValueError(f"mode must be 'holes' or 'islands', got {mode!r}")
    holes = mode == "holes"
    regions, n_regions = ndimage.label(mask ^ holes, structure=EIGHT_CONNECTED)
    sizes = np.bincount(regions.ravel(), minlength=n_regions + 1)[1:]  # label 0 is the other side
    small = sizes < area_thresh
    if not small.any():
        return mask, False
    if holes:
        return np.isin(regions, [0, *(np.flatnonzero(small) + 1)]), True
    big = np.flatnonzero(~small) + 1
    return np.isin(regions, big if big.size else [int(np.argmax(sizes)) + 1]), True


def postprocess_small_regions(masks: torch.Tensor, min_area: int, nms_thresh: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kept indices, their masks, their boxes) of (N, H, W) bool masks after filling holes and removing
    islands smaller than min_area; NMS prefers masks that needed no change (score 1 over 0)."""
    cleaned, unchanged = [], []
    for mask in masks.cpu().numpy():
        mask, filled = remove_small_regions(mask, min_area, "holes")
        mask, removed = remove_small_regions(mask, min_area, "islands")
        cleaned.append(torch.as_tensor(mask))
        unchanged.append(float(not (filled or removed)))
    cleaned = torch.stack(cleaned)
    boxes = mask_boxes(cleaned)
    keep = batched_nms(boxes.float(), torch.as_tensor(unchanged), torch.zeros(len(boxes)), iou_threshold=nms_thresh)
    return keep, cleaned[keep], boxes[keep]
