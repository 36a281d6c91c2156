"""SAM 2's FPN neck (sam2.modeling.backbones.image_encoder.FpnNeck) as the configs set it up.

Every trunk level is projected to d_model by a 1x1 conv; only the levels in fpn_top_down_levels
(the two lowest resolutions in every config) also get the level below them, upsampled 2x by
nearest neighbour (every config's fpn_interp_model), added. Each output comes with its sine positional encoding.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from samfast.sam2.position_encoding import PositionEmbeddingSine


class FpnNeck(nn.Module):
    def __init__(
        self,
        d_model: int,
        backbone_channel_list: list[int],
        fpn_top_down_levels: tuple[int, ...] = (2, 3),
    ) -> None:
        super().__init__()
        self.position_encoding = PositionEmbeddingSine(d_model)
        self.d_model = d_model
        self.backbone_channel_list = list(backbone_channel_list)
        # a Sequential holding "conv": the official key is convs.{i}.conv.weight
        self.convs = nn.ModuleList(
            nn.Sequential(OrderedDict(conv=nn.Conv2d(dim, d_model, kernel_size=1))) for dim in backbone_channel_list
        )
        self.fpn_top_down_levels = list(fpn_top_down_levels)

    def forward(self, xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Trunk levels (highest resolution first) -> (features, positional encodings), same order."""
        n = len(self.convs) - 1
        out: list[torch.Tensor] = [None] * (n + 1)
        pos: list[torch.Tensor] = [None] * (n + 1)
        prev = None
        for i in range(n, -1, -1):  # lowest resolution first, so the top-down sum can flow up
            lateral = self.convs[n - i](xs[i])
            if i in self.fpn_top_down_levels and prev is not None:
                # sam2 upsamples in fp32; back in the lateral's dtype so bf16 stays bf16 (a no-op in fp32)
                top_down = F.interpolate(prev.to(torch.float32), scale_factor=2.0, mode="nearest").to(lateral.dtype)
                prev = lateral + top_down
            else:
                prev = lateral
            out[i] = prev
            pos[i] = self.position_encoding(prev)
        return out, pos
