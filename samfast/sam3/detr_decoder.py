"""SAM 3's DETR decoder: object queries (and a presence token) attend to each other, to the prompt and to the image.

sam3.model.decoder.TransformerDecoder as sam3.model_builder builds it for the image model (box
refinement, boxRPB "log", a presence token, text cross-attention) in eval mode, where sam3 runs no
DAC (Sam3Image._run_decoder passes apply_dac = dac and training): the one-to-many query copies are a
training branch, left out. Parameters under sam3's names, so sam3's state dict loads strictly.

Each layer's cross-attention to the image takes an additive bias per head from each query's
reference box (boxRPB): an MLP of the log-scaled distances of every pixel row (column) to the box's
top and bottom (left and right) edges, summed over rows and columns.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from samfast.modeling.mask_decoder import MLP
from samfast.sam3.boxes import box_cxcywh_to_xyxy, inverse_sigmoid
from samfast.sam3.multihead_attention import MultiheadAttention, padding_bias


class DetrDecoderLayer(nn.Module):
    """sam3's TransformerDecoderLayer (use_text_cross_attention=True), post-norm: self-attention, text
    cross-attention, image cross-attention, ReLU FFN. Batch-first (B, 1 + Q, C): the presence token
    first, with no position, then the queries."""

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int) -> None:
        super().__init__()
        self.cross_attn = MultiheadAttention(d_model, num_heads)
        self.norm1 = nn.LayerNorm(d_model)
        self.ca_text = MultiheadAttention(d_model, num_heads)
        self.catext_norm = nn.LayerNorm(d_model)
        self.self_attn = MultiheadAttention(d_model, num_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        text: torch.Tensor,
        text_bias: torch.Tensor,
        image_keys: torch.Tensor,
        image: torch.Tensor,
        image_bias: torch.Tensor,
    ) -> torch.Tensor:
        """x, pos (B, 1 + Q, C); text (B, S, C) with its padding bias; image_keys (image + its positions)
        and image (B, HW, C); image_bias (B, H, 1 + Q, HW)."""
        q = x + pos
        x = self.norm2(x + self.self_attn(q, q, x))
        x = self.catext_norm(x + self.ca_text(x + pos, text, text, text_bias))
        x = self.norm1(x + self.cross_attn(x + pos, image_keys, image, image_bias))
        return self.norm3(x + self.linear2(F.relu(self.linear1(x))))


def box_sine_embedding(boxes: torch.Tensor, dim: int) -> torch.Tensor:
    """(..., 4) cxcywh boxes -> (..., 2 * dim): sam3's gen_sineembed_for_position, dim / 2 sine-cosine
    features per coordinate, in the order y, x, w, h."""
    half = dim // 2
    dim_t = torch.arange(half, dtype=boxes.dtype, device=boxes.device)
    dim_t = 10000 ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / half)
    angles = (boxes * (2 * math.pi))[..., None] / dim_t  # (..., 4, half)
    features = torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), dim=-1).flatten(-2)
    cx, cy, w, h = features.unbind(-2)
    return torch.cat((cy, cx, w, h), dim=-1)


def log_scaled(deltas: torch.Tensor) -> torch.Tensor:
    """Distances in [-1, 1] (fractions of the image) to sign * log2(1 + 8|d|) / 3, in [-1, 1]."""
    deltas = deltas * 8
    return torch.sign(deltas) * torch.log2(torch.abs(deltas) + 1.0) / 3.0


class DetrDecoder(nn.Module):
    def __init__(
        self,
        d_model: int = 256,
        num_layers: int = 6,
        num_heads: int = 8,
        dim_feedforward: int = 2048,
        num_queries: int = 200,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        self.layers = nn.ModuleList(DetrDecoderLayer(d_model, num_heads, dim_feedforward) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.bbox_embed = MLP(d_model, d_model, 4, 3)
        self.query_embed = nn.Embedding(num_queries, d_model)
        self.reference_points = nn.Embedding(num_queries, 4)
        self.boxRPB_embed_x = MLP(2, d_model, num_heads, 2)
        self.boxRPB_embed_y = MLP(2, d_model, num_heads, 2)
        self.presence_token = nn.Embedding(1, d_model)
        self.presence_token_head = MLP(d_model, d_model, 1, 3)
        self.presence_token_out_norm = nn.LayerNorm(d_model)
        self.ref_point_head = MLP(2 * d_model, d_model, d_model, 2)

    def box_bias(self, boxes: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
        """(B, Q, 4) cxcywh reference boxes -> (B, heads, Q, H * W): each query's attention bias on each pixel."""
        height, width = feat_size
        x0, y0, x1, y1 = box_cxcywh_to_xyxy(boxes).unbind(-1)
        rows = torch.arange(height, dtype=boxes.dtype, device=boxes.device) / height
        cols = torch.arange(width, dtype=boxes.dtype, device=boxes.device) / width
        to_rows = rows[:, None] - torch.stack((y0, y1), dim=-1)[:, :, None, :]  # (B, Q, H, 2)
        to_cols = cols[:, None] - torch.stack((x0, x1), dim=-1)[:, :, None, :]  # (B, Q, W, 2)
        dtype = self.boxRPB_embed_y.layers[0].weight.dtype
        by_row = self.boxRPB_embed_y(log_scaled(to_rows).to(dtype))  # (B, Q, H, heads)
        by_col = self.boxRPB_embed_x(log_scaled(to_cols).to(dtype))  # (B, Q, W, heads)
        bias = by_row[:, :, :, None] + by_col[:, :, None, :]
        return bias.flatten(2, 3).permute(0, 3, 1, 2)

    def forward(
        self,
        memory: torch.Tensor,
        pos: torch.Tensor,
        memory_text: torch.Tensor,
        text_attention_mask: torch.Tensor,
        feat_size: tuple[int, int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """sam3's TransformerDecoder.forward as Sam3Image._run_decoder calls it, with its outputs and layouts.

        memory, pos (HW, B, C): the encoded image tokens and their positions; memory_text (S, B, C)
        the prompt tokens, text_attention_mask (B, S) True on padding; feat_size (H, W) of the one
        feature level (sam3 reads it from spatial_shapes; here a static shape). The queries and the
        initial reference boxes are the decoder's own embeddings (sam3's caller tiles query_embed).

        Returns, seq-first as sam3 does, for every layer: the normed query states (layers, Q, B, C),
        the reference boxes each layer started from (layers, Q, B, 4; cxcywh in [0, 1]), the presence
        logits (layers, 1, B); and the last layer's presence token (1, B, C).
        """
        image, image_pos = memory.transpose(0, 1), pos.transpose(0, 1)
        image_keys = image + image_pos
        text = memory_text.transpose(0, 1)
        text_bias = padding_bias(text_attention_mask, text.dtype)
        batch = image.shape[0]
        queries = self.query_embed.weight.expand(batch, -1, -1)
        presence = self.presence_token.weight.expand(batch, -1, -1)
        # the boxes in float32 whatever the weights, as under sam3's bf16 autocast (which keeps the
        # embeddings' weights, the sigmoids and the additions in float32): a bf16 box is off by up to
        # 4 pixels of 1008, and each layer refines the last one's
        boxes = self.reference_points.weight.float().sigmoid().expand(batch, -1, -1)
        hidden, start_boxes, presence_logits = [], [], []
        for layer in self.layers:
            query_pos = self.ref_point_head(box_sine_embedding(boxes, self.d_model).to(queries.dtype))
            # the presence token takes no position and no box bias
            pos_all = F.pad(query_pos, (0, 0, 1, 0))
            image_bias = F.pad(self.box_bias(boxes, feat_size), (0, 0, 1, 0))
            out = layer(torch.cat((presence, queries), dim=1), pos_all, text, text_bias, image_keys, image, image_bias)
            presence, queries = out[:, :1], out[:, 1:]
            normed = self.norm(queries)
            start_boxes.append(boxes)
            boxes = (self.bbox_embed(normed).float() + inverse_sigmoid(boxes)).sigmoid()
            hidden.append(normed)
            # sam3 computes a clamp of these logits and discards it: they leave unclamped
            presence_logits.append(self.presence_token_head(self.presence_token_out_norm(presence)).squeeze(-1))
        return (
            torch.stack(hidden).transpose(1, 2),
            torch.stack(start_boxes).transpose(1, 2),
            torch.stack(presence_logits).transpose(1, 2),
            presence.transpose(0, 1),
        )
