"""Two-way transformer of the mask decoder: prompt tokens and image tokens attend to each other."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from samfast import kernels

from .common import MLPBlock


class TwoWayTransformer(nn.Module):
    def __init__(
        self,
        depth: int,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int,
        attention_downsample_rate: int = 2,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            TwoWayAttentionBlock(
                embedding_dim,
                num_heads,
                mlp_dim,
                attention_downsample_rate=attention_downsample_rate,
                skip_first_layer_pe=(i == 0),
            )
            for i in range(depth)
        )
        self.final_attn_token_to_image = Attention(embedding_dim, num_heads, attention_downsample_rate)
        self.norm_final_attn = nn.LayerNorm(embedding_dim)
        # The triton switch: the cross attentions with their projections folded into per-prompt
        # matrices, one pass over the image tokens each (samfast.kernels.decoder_attention)
        self.fused_cross_attention = False
        # Set by a decoder whose compiled graph takes any number of tokens per prompt (SAM 2's): the
        # kernels pad every prompt's tokens to the most they take, a width constant at trace time
        self.pad_tokens_to_widest = False

    def forward(
        self,
        image_embedding: Tensor,
        image_pe: Tensor,
        point_embedding: Tensor,
        image_index: Tensor | None = None,
        fused: bool | None = None,
    ) -> tuple[Tensor, Tensor]:
        """image_embedding, image_pe: (B, C, h, w); point_embedding: (P, N, C) -> (queries, keys), both per prompt.

        Without image_index, B == P: one image embedding per prompt. With image_index (P,), prompt p
        reads image image_index[p], and the first layer's image-side work (its projections of the
        image tokens) runs once per image instead of once per prompt. fused: the cross attentions on
        the kernels or not, for this call (None: as fused_cross_attention says).
        """
        image_embedding = image_embedding.flatten(2).permute(0, 2, 1)
        image_pe = image_pe.flatten(2).permute(0, 2, 1)
        queries, keys = point_embedding, image_embedding
        fused = self.fused_cross_attention if fused is None else fused
        widest = self.pad_tokens_to_widest
        for layer in self.layers:
            queries, keys = layer(queries, keys, query_pe=point_embedding, key_pe=image_pe, image_index=image_index,
                                  fused=fused, widest=widest)
            image_index = None  # from here on the keys hold each prompt's own image tokens
        final, q = self.final_attn_token_to_image, queries + point_embedding
        if fused:
            attended = kernels.token_to_image_attention(final, q, keys, image_pe, widest=widest)
        else:
            attended = final(q=q, k=keys + image_pe, v=keys)
        queries = self.norm_final_attn(queries + attended)
        return queries, keys


class TwoWayAttentionBlock(nn.Module):
    """Self-attention of tokens, tokens->image, token MLP, image->tokens."""

    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int = 2048,
        attention_downsample_rate: int = 2,
        skip_first_layer_pe: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(embedding_dim, num_heads)
        self.norm1 = nn.LayerNorm(embedding_dim)
        self.cross_attn_token_to_image = Attention(embedding_dim, num_heads, attention_downsample_rate)
        self.norm2 = nn.LayerNorm(embedding_dim)
        self.mlp = MLPBlock(embedding_dim, mlp_dim, nn.ReLU)
        self.norm3 = nn.LayerNorm(embedding_dim)
        self.norm4 = nn.LayerNorm(embedding_dim)
        self.cross_attn_image_to_token = Attention(embedding_dim, num_heads, attention_downsample_rate)
        self.skip_first_layer_pe = skip_first_layer_pe

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        query_pe: Tensor,
        key_pe: Tensor,
        image_index: Tensor | None = None,
        fused: bool = False,
        widest: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """queries (P, N, C) per prompt; keys (P, L, C) per prompt, or per image (B, L, C) with image_index (P,).

        Per-image keys are projected once per image and the projections gathered to the prompts:
        the same numbers as projecting a per-prompt copy, without making that copy first. `fused`:
        both cross attentions through samfast.kernels.decoder_attention, which read per-image
        keys through image_index and never write per-prompt projections (`widest`: theirs).
        """

        def per_prompt(x: Tensor) -> Tensor:
            return x if image_index is None else x.index_select(0, image_index)

        if self.skip_first_layer_pe:
            queries = self.self_attn(q=queries, k=queries, v=queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q=q, k=q, v=queries)
        queries = self.norm1(queries)

        to_image = self.cross_attn_token_to_image
        if fused:
            attended = kernels.token_to_image_attention(to_image, queries + query_pe, keys, key_pe, image_index,
                                                        widest=widest)
        else:
            k = keys + key_pe
            attended = to_image.attend(
                to_image.heads(to_image.q_proj(queries + query_pe)),
                per_prompt(to_image.heads(to_image.k_proj(k))),
                per_prompt(to_image.heads(to_image.v_proj(keys))),
            )
        queries = self.norm2(queries + attended)
        queries = self.norm3(queries + self.mlp(queries))

        to_token = self.cross_attn_image_to_token
        if fused:
            keys = kernels.image_to_token_attention(
                to_token, self.norm4, keys, key_pe, queries + query_pe, queries, image_index, widest=widest
            )
        else:
            attended = to_token.attend(
                per_prompt(to_token.heads(to_token.q_proj(k))),
                to_token.heads(to_token.k_proj(queries + query_pe)),
                to_token.heads(to_token.v_proj(queries)),
            )
            keys = self.norm4(per_prompt(keys) + attended)
        return queries, keys


class Attention(nn.Module):
    """Multi-head attention whose projections may shrink the width by downsample_rate."""

    def __init__(self, embedding_dim: int, num_heads: int, downsample_rate: int = 1) -> None:
        super().__init__()
        self.internal_dim = embedding_dim // downsample_rate
        self.num_heads = num_heads
        if self.internal_dim % num_heads:
            raise ValueError(f"num_heads ({num_heads}) must divide the internal width {self.internal_dim}")
        self.q_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.k_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.v_proj = nn.Linear(embedding_dim, self.internal_dim)
        self.out_proj = nn.Linear(self.internal_dim, embedding_dim)
        self.attn_impl = "math"

    def heads(self, x: Tensor) -> Tensor:
        """(B, L, heads * d) -> (B, heads, L, d)."""
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of projected, head-separated q, k, v, then the output projection."""
        if self.attn_impl == "math":
            # The reference's order of operations, so the fp32 stage equals it to rounding.
            attn = q @ k.permute(0, 1, 3, 2) / math.sqrt(q.shape[-1])
            out = torch.softmax(attn, dim=-1) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        b, heads, n, c = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, heads * c))

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.attend(self.heads(self.q_proj(q)), self.heads(self.k_proj(k)), self.heads(self.v_proj(v)))
