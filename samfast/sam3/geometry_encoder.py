"""SAM 3's geometry encoder (sam3.model.geometry_encoders.SequenceGeometryEncoder as sam3's model builder
configures it): box and point prompts as a sequence of tokens for the fusion encoder.

Each point is the sum of its label's embedding, a projection of its coordinates, a projection of the
(pre-normed) image feature sampled under it and a projection of its sine position encoding; each box the
same with a RoI-aligned 7x7 window pooled by a 7x7 convolution, and the encoding of its centre plus its
height and width. Points, then boxes, then a CLS token (one right-padded sequence per prompt), a linear
and a LayerNorm, then three pre-norm layers (self-attention over the prompt's tokens, cross-attention to
the image, ReLU FFN) and a final LayerNorm.

Static shapes throughout, no host sync: padding stays in the sequence, masked out of the attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torchvision  # noqa: F401  (registers torch.ops.torchvision)
from torch import nn

from samfast.sam3.fusion_encoder import FusionEncoderLayer
from samfast.sam3.geometric_prompt import Prompt, concat_padded_sequences
from samfast.sam3.multihead_attention import padding_bias


def box_cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)


def sine_encode_xy(x: torch.Tensor, y: torch.Tensor, num_feats: int, temperature: int = 10000) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., num_feats) sine / cosine encodings of normalized x and y, interleaved, in sam3's
    PositionEmbeddingSine._encode_xy order (so they equal it bit for bit)."""
    dim_t = torch.arange(num_feats, dtype=torch.float32, device=x.device)
    dim_t = temperature ** (2 * (dim_t // 2) / num_feats)

    def encode(v: torch.Tensor) -> torch.Tensor:
        pos = (v * (2 * math.pi))[..., None] / dim_t
        return torch.stack((pos[..., 0::2].sin(), pos[..., 1::2].cos()), dim=-1).flatten(-2)

    return encode(x), encode(y)


class SequenceGeometryEncoder(nn.Module):
    def __init__(
        self, d_model: int = 256, num_heads: int = 8, dim_feedforward: int = 2048, num_layers: int = 3, roi_size: int = 7
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.roi_size = roi_size
        self.label_embed = nn.Embedding(2, d_model)  # 0 negative, 1 positive
        self.cls_embed = nn.Embedding(1, d_model)
        self.points_direct_project = nn.Linear(2, d_model)
        self.points_pool_project = nn.Linear(d_model, d_model)
        self.points_pos_enc_project = nn.Linear(d_model, d_model)
        self.boxes_direct_project = nn.Linear(4, d_model)
        self.boxes_pool_project = nn.Conv2d(d_model, d_model, roi_size)
        self.boxes_pos_enc_project = nn.Linear(d_model + 2, d_model)
        self.final_proj = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.img_pre_norm = nn.LayerNorm(d_model)
        self.encode = nn.ModuleList(
            FusionEncoderLayer(d_model, num_heads, dim_feedforward, pos_enc_at_attn=False, pos_enc_at_cross_attn_keys=True)
            for _ in range(num_layers)
        )
        self.encode_norm = nn.LayerNorm(d_model)

    def forward(
        self,
        geo_prompt: Prompt,
        img_feats: list[torch.Tensor],
        img_sizes: list[tuple[int, int]],
        img_pos_embeds: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """sam3's signature: img_feats and img_pos_embeds lists of (HW, B, C) sequence-first feature levels,
        img_sizes their (H, W); the last level is used. Returns the prompt tokens (N_points + N_boxes + 1, B, C)
        and their padding mask (B, N_points + N_boxes + 1)."""
        memory = img_feats[-1]
        pos = img_pos_embeds[-1] if img_pos_embeds is not None else torch.zeros_like(memory)
        feature_map = self.img_pre_norm(memory).permute(1, 2, 0).unflatten(-1, tuple(img_sizes[-1]))

        points = self._encode_points(geo_prompt.point_embeddings, geo_prompt.point_labels, feature_map)
        boxes = self._encode_boxes(geo_prompt.box_embeddings, geo_prompt.box_labels, feature_map)
        tokens, mask = concat_padded_sequences(points, geo_prompt.point_mask, boxes, geo_prompt.box_mask)
        batch = tokens.shape[1]
        cls = self.cls_embed.weight.view(1, 1, self.d_model).expand(1, batch, -1)
        tokens, mask = concat_padded_sequences(tokens, mask, cls, mask.new_zeros(batch, 1))

        tokens = self.norm(self.final_proj(tokens)).transpose(0, 1)
        memory, pos, bias = memory.transpose(0, 1), pos.transpose(0, 1), padding_bias(mask, tokens.dtype)
        for layer in self.encode:
            tokens = layer(tokens, None, memory, memory_pos=pos, x_bias=bias)
        return self.encode_norm(tokens).transpose(0, 1), mask

    def _encode_points(self, points: torch.Tensor, labels: torch.Tensor, feature_map: torch.Tensor) -> torch.Tensor:
        """(N, B, 2) normalized xy (float32 whatever the weights) -> (N, B, C) in the weights' dtype."""
        dtype = self.points_direct_project.weight.dtype
        if points.shape[0] == 0:  # nothing to sample: inductor's grid_sample cannot take an empty grid of any batch
            return points.new_zeros(0, points.shape[1], self.d_model, dtype=dtype)
        embed = self.points_direct_project(points.to(dtype))
        # grid_sample wants (B, N, 1, 2) in [-1, 1]
        grid = points.transpose(0, 1).unsqueeze(2) * 2 - 1
        sampled = F.grid_sample(feature_map, grid.to(feature_map.dtype), align_corners=False)  # (B, C, N, 1)
        embed = embed + self.points_pool_project(sampled.squeeze(-1).permute(2, 0, 1))
        enc_x, enc_y = sine_encode_xy(points[..., 0], points[..., 1], self.d_model // 2)
        embed = embed + self.points_pos_enc_project(torch.cat([enc_x, enc_y], dim=-1).to(dtype))
        return self.label_embed(labels.long()) + embed

    def _encode_boxes(self, boxes: torch.Tensor, labels: torch.Tensor, feature_map: torch.Tensor) -> torch.Tensor:
        """(N, B, 4) normalized cx, cy, w, h (float32 whatever the weights) -> (N, B, C) in the weights' dtype.

        The coordinates and their encodings stay float32 until a projection takes them (bf16 would move a
        box edge by up to 4 pixels of 1008), and so does the RoI pooling, which torchvision has no bf16
        kernel of on every device."""
        n_boxes, batch = boxes.shape[:2]
        dtype = self.boxes_direct_project.weight.dtype
        embed = self.boxes_direct_project(boxes.to(dtype))
        # torchvision's op itself, not its wrapper: with deterministic algorithms on (as the goldens' fp32 sets
        # them) the wrapper calls a function dynamo refuses to trace, a graph break on a GPU; the op's forward
        # kernel is deterministic already (each output its own sum)
        pooled = torch.ops.torchvision.roi_align(feature_map.float(), self._rois(boxes, feature_map), 1.0,
                                                 self.roi_size, self.roi_size, -1, False)
        embed = embed + self.boxes_pool_project(pooled.to(dtype)).view(batch, n_boxes, self.d_model).transpose(0, 1)
        cx, cy, w, h = boxes.unbind(-1)
        enc_x, enc_y = sine_encode_xy(cx, cy, self.d_model // 2)
        position = torch.cat([enc_y, enc_x, h[..., None], w[..., None]], dim=-1)
        embed = embed + self.boxes_pos_enc_project(position.to(dtype))
        return self.label_embed(labels.long()) + embed

    @staticmethod
    def _rois(boxes: torch.Tensor, feature_map: torch.Tensor) -> torch.Tensor:
        """roi_align's (B * N, 5) rows (image index, x0, y0, x1, y1 in feature pixels), image by image.

        Scaled by Python numbers, not a (W, H, W, H) tensor, which would be a host-to-device copy per call."""
        height, width = feature_map.shape[-2:]
        x0, y0, x1, y1 = box_cxcywh_to_xyxy(boxes).transpose(0, 1).unbind(-1)
        corners = torch.stack([x0 * width, y0 * height, x1 * width, y1 * height], dim=-1)
        batch, n_boxes = corners.shape[:2]
        image = torch.arange(batch, dtype=corners.dtype, device=corners.device)[:, None, None].expand(-1, n_boxes, 1)
        return torch.cat([image, corners], dim=-1).reshape(batch * n_boxes, 5).float()
