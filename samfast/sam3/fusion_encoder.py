"""SAM 3's fusion encoder: image tokens attend to themselves, then to the prompt (text and geometry) tokens.

sam3.model.encoder.TransformerEncoderFusion as sam3.model_builder builds it for the image model
(one feature level, no level embedding, no pooled text added to the image: add_pooled_text_to_img_feat
False) in eval mode: its parameters under sam3's names, so sam3's state dict loads strictly. Pre-norm
layers; no final norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast.sam3.multihead_attention import MultiheadAttention, padding_bias


class FusionEncoderLayer(nn.Module):
    """sam3.model.encoder.TransformerEncoderLayer with pre_norm=True: self-attention, cross-attention, ReLU FFN,
    each on the layer-normed stream and added back to it. Batch-first (B, L, C).

    The three positional flags are sam3's: the fusion encoder adds the image positions to the
    self-attention's queries and keys only (pos_enc_at_attn); sam3's geometry encoder builds the
    same layer with the prompt positions on the cross-attention's keys instead.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dim_feedforward: int,
        pos_enc_at_attn: bool = True,
        pos_enc_at_cross_attn_keys: bool = False,
        pos_enc_at_cross_attn_queries: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, num_heads)
        self.cross_attn_image = MultiheadAttention(d_model, num_heads)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.pos_enc_at_attn = pos_enc_at_attn
        self.pos_enc_at_cross_attn_keys = pos_enc_at_cross_attn_keys
        self.pos_enc_at_cross_attn_queries = pos_enc_at_cross_attn_queries

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor | None,
        memory: torch.Tensor,
        memory_bias: torch.Tensor | None = None,
        memory_pos: torch.Tensor | None = None,
        x_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x, pos: (B, L, C) tokens and their positions (None where no flag adds them); memory (B, S, C)
        the tokens cross-attended to, memory_bias their additive attention bias (padding_bias),
        memory_pos their positions; x_bias the self-attention's (the geometry encoder's padded prompts)."""
        normed = self.norm1(x)
        q = normed + pos if self.pos_enc_at_attn else normed
        x = x + self.self_attn(q, q, normed, x_bias)
        normed = self.norm2(x)
        q = normed + pos if self.pos_enc_at_cross_attn_queries else normed
        k = memory + memory_pos if self.pos_enc_at_cross_attn_keys else memory
        x = x + self.cross_attn_image(q, k, memory, memory_bias)
        return x + self.linear2(F.relu(self.linear1(self.norm3(x))))


class FusionEncoder(nn.Module):
    """sam3's TransformerEncoderFusion (the image model's `transformer.encoder`): `num_layers` FusionEncoderLayers."""

    def __init__(
        self, d_model: int = 256, num_layers: int = 6, num_heads: int = 8, dim_feedforward: int = 2048
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FusionEncoderLayer(d_model, num_heads, dim_feedforward) for _ in range(num_layers))

    def forward(
        self,
        src: torch.Tensor,
        src_pos: torch.Tensor,
        prompt: torch.Tensor,
        prompt_key_padding_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The encoded image tokens (HW, B, C), seq-first as sam3 returns them ("memory").

        The inputs are the tensors sam3's Sam3Image._run_encoder hands its encoder, in its layouts:
        src, src_pos (HW, B, C) the image tokens and their positions (the one level's entry of its
        lists; the encoder's "pos_embed" output is src_pos unchanged), prompt (S, B, C) and
        prompt_key_padding_mask (B, S), True on padding. The prompt is not changed ("memory_text").
        """
        x, pos = src.transpose(0, 1), src_pos.transpose(0, 1)
        prompt = prompt.transpose(0, 1)
        bias = padding_bias(prompt_key_padding_mask, prompt.dtype)
        for layer in self.layers:
            x = layer(x, pos, prompt, bias)
        return x.transpose(0, 1)
