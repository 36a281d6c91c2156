"""Per-mask scores and boxes computed on the masks' device, without reading anything back.

Each function gives what segment_anything.utils.amg gives (calculate_stability_score,
batched_mask_to_box, is_box_near_crop_edge) to the bit; tests/unit/test_amg.py checks it. The
reference's crop-edge test builds its boxes with torch.tensor(list, device=...), a host-to-device
copy from pageable memory (a sync on CUDA): here the crop coordinates stay Python numbers.
"""

from __future__ import annotations

import torch


def stability_score(logits: torch.Tensor, threshold: float, offset: float) -> torch.Tensor:
    """IoU of the masks thresholded at threshold + offset and at threshold - offset: (N, H, W) -> (N,)."""
    # the high mask lies inside the low one, so the IoU is a ratio of pixel counts
    inner = (logits > threshold + offset).sum(-1, dtype=torch.int16).sum(-1, dtype=torch.int32)
    outer = (logits > threshold - offset).sum(-1, dtype=torch.int16).sum(-1, dtype=torch.int32)
    return inner / outer


def mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """(N, H, W) bool -> (N, 4) int64 x0, y0, x1, y1 (inclusive pixel bounds); 0, 0, 0, 0 for an empty mask."""
    h, w = masks.shape[-2:]
    rows, cols = masks.any(-1), masks.any(-2)
    # argmax gives the first maximal index: the first True from either end
    top, left = rows.byte().argmax(-1), cols.byte().argmax(-1)
    bottom, right = h - 1 - rows.flip(-1).byte().argmax(-1), w - 1 - cols.flip(-1).byte().argmax(-1)
    boxes = torch.stack([left, top, right, bottom], dim=-1)
    return boxes * rows.any(-1, keepdim=True)


def near_crop_edge(boxes: torch.Tensor, crop_box: list[int], image_size: tuple[int, int], atol: float = 20.0) -> torch.Tensor:
    """(N,) True for crop-frame boxes within atol of the crop's border where that border is not the image's."""
    x0, y0 = crop_box[:2]
    image_box = (0, 0, image_size[1], image_size[0])
    near = []
    for i, offset in enumerate((x0, y0, x0, y0)):
        coord = (boxes[:, i] + offset).float()
        near.append(((coord - crop_box[i]).abs() <= atol) & ~((coord - image_box[i]).abs() <= atol))
    return torch.stack(near, dim=1).any(dim=1)
