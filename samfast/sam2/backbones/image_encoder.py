"""SAM 2's image encoder: trunk, then neck, dropping the lowest-resolution level (scalp=1 in every config)."""

from __future__ import annotations

import torch
from torch import nn

from samfast.sam2.backbones.hiera import Hiera
from samfast.sam2.backbones.neck import FpnNeck
from samfast.sam2.config import IMAGE_SIZE


class ImageEncoder(nn.Module):
    def __init__(self, trunk: Hiera, neck: FpnNeck, scalp: int = 1) -> None:
        super().__init__()
        if trunk.channel_list != neck.backbone_channel_list:
            raise ValueError(f"trunk widths {trunk.channel_list} do not match the neck's {neck.backbone_channel_list}")
        self.trunk = trunk
        self.neck = neck
        self.scalp = scalp

    def compile(self, *args, **kwargs) -> None:
        """nn.Module.compile, after filling the neck's positional encodings of the model's input
        size (PositionEmbeddingSine.fill_cache) in the neck's device and dtype."""
        weight = self.neck.convs[0].conv.weight
        for hw in self.trunk.output_sizes((IMAGE_SIZE, IMAGE_SIZE)):
            self.neck.position_encoding.fill_cache(hw, weight.device, weight.dtype)
        super().compile(*args, **kwargs)

    def forward(self, sample: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """sam2's dict: backbone_fpn and vision_pos_enc (strides 4, 8, 16), vision_features (stride 16)."""
        features, pos = self.neck(self.trunk(sample))
        if self.scalp > 0:
            features, pos = features[: -self.scalp], pos[: -self.scalp]
        return {"vision_features": features[-1], "vision_pos_enc": pos, "backbone_fpn": features}
