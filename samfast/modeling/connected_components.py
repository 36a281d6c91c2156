"""Connected components of binary masks on any device, in torch: each pixel's component size.

What sam3's predictors fill small holes with (sam3.perflib.connected_components: cc_torch, its Triton
kernel on a GPU, scikit-image's label on a CPU): 8-connected components, every pixel of one counted
with the component's pixel count. Here by label propagation: every foreground pixel starts with its own
index, takes the largest label among its eight neighbours and itself, then the label held by the pixel
its label names (pointer jumping, which halves long chains), until nothing changes. Labels only grow
and stay inside a component, so each component ends with its largest index. One host sync per round
(the convergence test). Rounds measured on the CPU: 9 to 45 on random 256 x 256 masks (densities 0.3 to
0.9), 260 on one snake that fills a 256 x 256 mask (a path of 16,573 pixels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _neighbourhood_max(labels: torch.Tensor) -> torch.Tensor:
    """(N, H, W) int64: the largest label over each pixel's 3 x 3 neighbourhood (zero beyond the border)."""
    height, width = labels.shape[-2:]
    padded = F.pad(labels, (1, 1, 1, 1))
    out = labels
    for dy in range(3):
        for dx in range(3):
            out = torch.maximum(out, padded[:, dy:dy + height, dx:dx + width])
    return out


def component_sizes(mask: torch.Tensor) -> torch.Tensor:
    """(..., H, W) bool -> (..., H, W) int64: each True pixel's 8-connected component's pixel count, 0 on
    False pixels. Components never cross from one (H, W) mask to another."""
    if mask.dtype != torch.bool:
        raise TypeError(f"component_sizes takes a bool mask, got {mask.dtype}: compare it with a threshold first")
    shape = mask.shape
    mask = mask.reshape(-1, *shape[-2:])
    # 1-based pixel indices over the whole batch: labels of different masks never meet, as every
    # neighbourhood stays inside its own mask (the padding is zero)
    labels = torch.arange(1, mask.numel() + 1, device=mask.device).view(mask.shape).masked_fill(~mask, 0)
    flat_with_zero = torch.cat([labels.new_zeros(1), labels.flatten()])
    while True:
        grown = _neighbourhood_max(labels).masked_fill_(~mask, 0)
        flat_with_zero[1:] = grown.flatten()
        jumped = flat_with_zero[grown]  # the label of the pixel each label names (0 stays 0)
        if torch.equal(jumped, labels):
            break
        labels = jumped
    sizes = torch.bincount(labels.flatten(), minlength=mask.numel() + 1)
    sizes[0] = 0
    return sizes[labels].view(shape)
