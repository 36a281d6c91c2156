"""Prompt encoder: points, boxes and masks to sparse and dense embeddings.

Differs from segment_anything only where the reference synchronizes or assumes fp32: point
labels select their embeddings with torch.where instead of boolean-mask indexing (which needs
the mask's count on the host), and the random-Fourier positional encoding is computed in fp32
and cast to the weights' dtype (sin/cos of arguments near 100 lose their digits in bf16).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .common import LayerNorm2d


class PromptEncoder(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        image_embedding_size: tuple[int, int],
        input_image_size: tuple[int, int],
        mask_in_chans: int,
    ) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.input_image_size = input_image_size
        self.image_embedding_size = image_embedding_size
        self.pe_layer = PositionEmbeddingRandom(embed_dim // 2)
        # positive/negative point, then the two box corners
        self.point_embeddings = nn.ModuleList(nn.Embedding(1, embed_dim) for _ in range(4))
        self.not_a_point_embed = nn.Embedding(1, embed_dim)
        self.mask_input_size = (4 * image_embedding_size[0], 4 * image_embedding_size[1])
        self.mask_downscaling = nn.Sequential(
            nn.Conv2d(1, mask_in_chans // 4, kernel_size=2, stride=2),
            LayerNorm2d(mask_in_chans // 4),
            nn.GELU(),
            nn.Conv2d(mask_in_chans // 4, mask_in_chans, kernel_size=2, stride=2),
            LayerNorm2d(mask_in_chans),
            nn.GELU(),
            nn.Conv2d(mask_in_chans, embed_dim, kernel_size=1),
        )
        self.no_mask_embed = nn.Embedding(1, embed_dim)

    @property
    def dtype(self) -> torch.dtype:
        return self.no_mask_embed.weight.dtype

    def get_dense_pe(self) -> torch.Tensor:
        """Positional encoding of every image-embedding cell: (1, C, h, w)."""
        return self.pe_layer(self.image_embedding_size).unsqueeze(0).to(self.dtype)

    def _embed_points(self, points: torch.Tensor, labels: torch.Tensor, pad: bool) -> torch.Tensor:
        points = points + 0.5  # centre of the pixel
        if pad:
            points = torch.cat([points, points.new_zeros(points.shape[0], 1, 2)], dim=1)
            labels = torch.cat([labels, labels.new_full((labels.shape[0], 1), -1)], dim=1)
        embedding = self.pe_layer.forward_with_coords(points, self.input_image_size).to(self.dtype)
        labels = labels[..., None]
        embedding = torch.where(labels == -1, self.not_a_point_embed.weight, embedding)
        embedding = embedding + torch.where(labels == 0, self.point_embeddings[0].weight, 0.0)
        return embedding + torch.where(labels == 1, self.point_embeddings[1].weight, 0.0)

    def _embed_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        coords = (boxes + 0.5).reshape(-1, 2, 2)
        corners = self.pe_layer.forward_with_coords(coords, self.input_image_size).to(self.dtype)
        corner_embeds = torch.cat([self.point_embeddings[2].weight, self.point_embeddings[3].weight])
        return corners + corner_embeds

    @staticmethod
    def _batch_size(points, boxes, masks) -> int:
        if points is not None:
            return points[0].shape[0]
        if boxes is not None:
            return boxes.shape[0]
        if masks is not None:
            return masks.shape[0]
        return 1

    def forward(
        self,
        points: tuple[torch.Tensor, torch.Tensor] | None,
        boxes: torch.Tensor | None,
        masks: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sparse (B, N, C) embeddings of points and boxes; dense (B, C, h, w) of masks."""
        bs = self._batch_size(points, boxes, masks)
        weight = self.no_mask_embed.weight
        sparse = [weight.new_empty(bs, 0, self.embed_dim)]
        if points is not None:
            sparse.append(self._embed_points(*points, pad=boxes is None))
        if boxes is not None:
            sparse.append(self._embed_boxes(boxes))
        if masks is not None:
            dense = self.mask_downscaling(masks.to(self.dtype))
        else:
            dense = weight.reshape(1, -1, 1, 1).expand(bs, -1, *self.image_embedding_size)
        return torch.cat(sparse, dim=1), dense


class PositionEmbeddingRandom(nn.Module):
    """Positional encoding with random spatial frequencies, always evaluated in fp32."""

    def __init__(self, num_pos_feats: int = 64) -> None:
        super().__init__()
        self.register_buffer("positional_encoding_gaussian_matrix", torch.randn((2, num_pos_feats)))

    def _pe_encoding(self, coords: torch.Tensor) -> torch.Tensor:
        coords = 2 * coords - 1
        coords = coords @ self.positional_encoding_gaussian_matrix.float()
        coords = 2 * math.pi * coords
        return torch.cat([torch.sin(coords), torch.cos(coords)], dim=-1)

    def forward(self, size: tuple[int, int]) -> torch.Tensor:
        """(C, h, w) encoding of the centres of an h x w grid."""
        h, w = size
        device = self.positional_encoding_gaussian_matrix.device
        grid = torch.ones((h, w), device=device, dtype=torch.float32)
        y_embed = (grid.cumsum(dim=0) - 0.5) / h
        x_embed = (grid.cumsum(dim=1) - 0.5) / w
        return self._pe_encoding(torch.stack([x_embed, y_embed], dim=-1)).permute(2, 0, 1)

    def forward_with_coords(self, coords: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """Encode (B, N, 2) pixel coordinates (x, y) of an image of size (H, W)."""
        coords = coords.float()
        # Python-scalar divisions: a tensor of the sizes would be a host-to-device copy.
        normalized = torch.stack([coords[..., 0] / image_size[1], coords[..., 1] / image_size[0]], dim=-1)
        return self._pe_encoding(normalized)
