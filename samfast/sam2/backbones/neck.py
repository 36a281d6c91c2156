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

from samfast.modeling.position_encoding import PositionEmbeddingSine


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
        # the decoder's 1x1 convs of the highest-resolution levels (conv_s0, conv_s1), when the compile
        # switch has them applied here (project_high_res); a tuple, so they stay the decoder's parameters
        self.high_res_heads: tuple[nn.Conv2d, ...] = ()

    def project_high_res(self, heads: tuple[nn.Conv2d, ...]) -> None:
        """Have levels 0, 1, ... come out through these 1x1 convs (the decoder's conv_s0, conv_s1), each
        folded into its level's own 1x1 conv: one conv from the trunk's width straight to the head's
        (144 -> 32 channels at stride 4 for hiera_l) instead of a d_model-wide map written, copied out of
        the compiled encoder and read again (268 MB a batch of 8 at stride 4). Only levels that take no
        top-down sum and feed none, so that nothing else reads their d_model-wide map."""
        for level in range(len(heads)):
            if level in self.fpn_top_down_levels or level - 1 in self.fpn_top_down_levels:
                raise ValueError(f"level {level} is part of the top-down sum {self.fpn_top_down_levels}: "
                                 "its d_model-wide map is read there, so its head cannot be folded in")
        self.high_res_heads = tuple(heads)

    def forward(self, xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Trunk levels (highest resolution first) -> (features, positional encodings), same order."""
        n = len(self.convs) - 1
        out: list[torch.Tensor] = [None] * (n + 1)
        pos: list[torch.Tensor] = [None] * (n + 1)
        prev = None
        for i in range(n, -1, -1):  # lowest resolution first, so the top-down sum can flow up
            conv = self.convs[n - i].conv
            lateral = folded_1x1(xs[i], conv, self.high_res_heads[i]) if i < len(self.high_res_heads) else conv(xs[i])
            if i in self.fpn_top_down_levels and prev is not None:
                # sam2 upsamples in fp32; back in the lateral's dtype so bf16 stays bf16 (a no-op in fp32)
                top_down = F.interpolate(prev.to(torch.float32), scale_factor=2.0, mode="nearest").to(lateral.dtype)
                prev = lateral + top_down
            else:
                prev = lateral
            out[i] = prev
            pos[i] = self.position_encoding(prev)
        return out, pos


def folded_1x1(x: torch.Tensor, first: nn.Conv2d, second: nn.Conv2d) -> torch.Tensor:
    """second(first(x)) for two 1x1 convs as one: (W2 W1) x + (W2 b1 + b2), the product taken in fp32 or
    wider (a few thousand multiply-adds a call) and rounded once to x's dtype."""
    wide = torch.promote_types(x.dtype, torch.float32)
    w1, w2 = first.weight.flatten(1).to(wide), second.weight.flatten(1).to(wide)
    weight = (w2 @ w1).to(x.dtype)[..., None, None]
    bias = (w2 @ first.bias.to(wide) + second.bias.to(wide)).to(x.dtype)
    return F.conv2d(x, weight, bias)
