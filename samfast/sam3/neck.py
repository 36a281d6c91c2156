"""SAM 3's neck (sam3.model.necks.Sam3DualViTDetNeck): ViTDet's simple feature pyramid over the trunk's last map.

Each scale factor is one branch from the (B, C, 72, 72) map: 4x up by two 2x2 transposed convs (a
GELU between), 2x up by one, 1x as is, or 0.5x by a 2x2 max pool; then a 1x1 conv to d_model and a
3x3 conv. With add_sam2_neck a second, identical set of branches (its own weights, sam2_convs) feeds
the SAM 2-style tracker. Every output comes with its sine positional encoding, which depends only on
the map's size (samfast.modeling.position_encoding, equal to sam3's PositionEmbeddingSine with
normalize=True, and cached per size).

The trunk is held as `trunk` and the branches under sam3's module names, so that the neck's state
dict is sam3's key for key.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from samfast.modeling.position_encoding import PositionEmbeddingSine
from samfast.sam3.vit import ViT


class Sam3DualViTDetNeck(nn.Module):
    def __init__(
        self,
        trunk: ViT,
        d_model: int = 256,
        scale_factors: tuple[float, ...] = (4.0, 2.0, 1.0, 0.5),
        add_sam2_neck: bool = False,
    ) -> None:
        super().__init__()
        self.trunk = trunk
        # SAM 3 builds it with num_pos_feats=256, its d_model
        self.position_encoding = PositionEmbeddingSine(d_model)
        self.scale_factors = tuple(scale_factors)
        self.convs = nn.ModuleList(scale_branch(trunk.embed_dim, d_model, s) for s in scale_factors)
        self.sam2_convs = (
            nn.ModuleList(scale_branch(trunk.embed_dim, d_model, s) for s in scale_factors) if add_sam2_neck else None
        )

    def forward(
        self, images: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """(SAM 3 features, their encodings, SAM 2 features, their encodings), highest resolution first;
        the SAM 2 pair is None without add_sam2_neck."""
        x = self.trunk(images)[-1]
        sam3_out = [branch(x) for branch in self.convs]
        sam3_pos = [self.position_encoding(out) for out in sam3_out]
        if self.sam2_convs is None:
            return sam3_out, sam3_pos, None, None
        sam2_out = [branch(x) for branch in self.sam2_convs]
        sam2_pos = [self.position_encoding(out) for out in sam2_out]
        return sam3_out, sam3_pos, sam2_out, sam2_pos


def scale_branch(dim: int, d_model: int, scale: float) -> nn.Sequential:
    """One pyramid level from a dim-channel map, its layers under sam3's names."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    if scale == 4.0:
        layers["dconv_2x2_0"] = nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2)
        layers["gelu"] = nn.GELU()
        layers["dconv_2x2_1"] = nn.ConvTranspose2d(dim // 2, dim // 4, kernel_size=2, stride=2)
        out_dim = dim // 4
    elif scale == 2.0:
        layers["dconv_2x2"] = nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2)
        out_dim = dim // 2
    elif scale == 1.0:
        out_dim = dim
    elif scale == 0.5:
        layers["maxpool_2x2"] = nn.MaxPool2d(kernel_size=2, stride=2)
        out_dim = dim
    else:
        raise ValueError(f"scale factor {scale} is not one of SAM 3's neck's (4.0, 2.0, 1.0, 0.5): pick from those")
    layers["conv_1x1"] = nn.Conv2d(out_dim, d_model, kernel_size=1)
    layers["conv_3x3"] = nn.Conv2d(d_model, d_model, kernel_size=3, padding=1)
    return nn.Sequential(layers)
