"""SAM 3's text encoder (sam3.model.text_encoder_ve.VETextEncoder): a causal CLIP text transformer
whose per-token features, projected to the detector's width, are what the detector attends to.

Parameter names and shapes are sam3's, so its state dict loads with strict=True:
`encoder.token_embedding`, `encoder.positional_embedding`, `encoder.transformer.resblocks.{i}`
(`ln_1`, `attn.in_proj_weight`, `attn.in_proj_bias`, `attn.out_proj`, `ln_2`, `mlp.c_fc`,
`mlp.c_proj`), `encoder.ln_final`, `encoder.text_projection`, `resizer`.

Inference only. sam3 runs its blocks through nn.MultiheadAttention with an additive -inf upper
triangle, which the "math" path (`attn_impl`, the fp32 stage's) writes out too; the "sdpa" path calls
F.scaled_dot_product_attention with is_causal=True, the same mask without materializing it (and what
lets flash attention take it on a GPU). sam3 embeds the tokens
twice (once for the returned embeddings, once inside the transformer) and multiplies every token by
`text_projection` only to discard the product: here the embeddings are computed once and the
projection, kept for the checkpoint, is not applied.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from samfast.modeling.attention import attention
from samfast.modeling.static_batch import in_static_batches
from samfast.sam3.tokenizer import SAM3_CONTEXT_LENGTH
from samfast.transfer import to_device


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention over (B, L, D) under a causal mask, with nn.MultiheadAttention's
    parameters (`in_proj_weight` (3D, D) rows q, k, v; `in_proj_bias`; `out_proj`) and its init."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} does not split into {num_heads} heads: pick heads that divide it")
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)
        self.attn_impl = "sdpa"  # "math" or "sdpa", set by the stages (samfast.stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = qkv.view(b, length, 3, self.num_heads, dim // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.attn_impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            bias = torch.zeros(length, length, dtype=x.dtype, device=x.device).masked_fill(future, float("-inf"))
            out = attention(q, k, v, q.shape[-1] ** -0.5, self.attn_impl, bias)
        return self.out_proj(out.transpose(1, 2).reshape(b, length, dim))


class TextBlock(nn.Module):
    """Pre-norm transformer block (sam3's ResidualAttentionBlock as VETextEncoder builds it: no
    LayerScale, exact GELU, MLP 4x wide)."""

    def __init__(self, width: int, heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(
            OrderedDict([("c_fc", nn.Linear(width, hidden)), ("gelu", nn.GELU()), ("c_proj", nn.Linear(hidden, width))])
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TextBlocks(nn.Module):
    """The block stack under sam3's `transformer.resblocks` names."""

    def __init__(self, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.width = width
        self.layers = layers
        self.resblocks = nn.ModuleList(TextBlock(width, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.resblocks:
            x = block(x)
        return x


class TextTransformer(nn.Module):
    """Token embedding + learned positions -> causal blocks -> final LayerNorm, per token (sam3's
    TextTransformer with pool_type "none" and output_tokens, as VETextEncoder builds it)."""

    def __init__(
        self,
        context_length: int,
        vocab_size: int,
        width: int,
        heads: int,
        layers: int,
        use_ln_post: bool = True,
        output_dim: int = 512,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.width = width
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(torch.empty(context_length, width))
        self.transformer = TextBlocks(width, layers, heads)
        self.ln_final = nn.LayerNorm(width) if use_ln_post else nn.Identity()
        # In the checkpoint only: sam3 computes features @ text_projection and discards the product.
        # output_dim is 512 because VETextEncoder leaves TextTransformer's default.
        self.text_projection = nn.Parameter(torch.empty(width, output_dim))
        fill_unset_text_parameters(self)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) token ids, L <= context_length -> ((B, L, width) token embeddings, (B, L, width) features)."""
        embeds = self.token_embedding(tokens)
        x = self.transformer(embeds + self.positional_embedding[: tokens.shape[1]])
        return embeds, self.ln_final(x)


class TextEncoder(nn.Module):
    """Phrases -> (padding mask, features for the detector, token embeddings), as sam3's VETextEncoder.

    `forward(phrases)` tokenizes on the host (the tokenizer is Python) and calls `encode`, the
    tensor-only part, which has static shapes: (B, context_length) in, no host syncs.
    """

    def __init__(
        self,
        d_model: int,
        tokenizer: Callable[..., torch.Tensor],
        width: int = 1024,
        heads: int = 16,
        layers: int = 24,
        context_length: int = SAM3_CONTEXT_LENGTH,
        vocab_size: int = 49408,
        use_ln_post: bool = True,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.tokenizer = tokenizer
        self.encoder = TextTransformer(context_length, vocab_size, width, heads, layers, use_ln_post)
        self.resizer = nn.Linear(width, d_model)
        self.static_batch: int | None = None  # set by compile_for_batches

    def compile_for_batches(self, size: int) -> None:
        """The compile switch's: the transformer compiled for batches of exactly `size` phrases (fewer padded,
        more split: samfast.modeling.static_batch), its one shape, so it never recompiles."""
        self.static_batch = size
        self.encoder.compile(dynamic=False, fullgraph=True)

    def forward(
        self, text: list[str], device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """See `encode`; tokens go to `device`, by default the one the weights are on."""
        tokens = self.tokenizer(text, context_length=self.context_length)
        device = self.resizer.weight.device if device is None else device
        # through pinned memory: a pageable copy to a GPU makes the host wait for it
        return self.encode(to_device(tokens, torch.long, device))

    def encode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, L) token ids (0 pads) -> (B, L) bool mask, True at padding (PyTorch's key_padding_mask
        convention); (L, B, d_model) features; (L, B, width) token embeddings. Sequence first, as sam3
        returns them: the features contiguous in that order (the resizer writes them so), the embeddings
        a transposed view. Id 0 is also the BPE piece '!' inside a word ("!@!"): sam3 masks it as
        padding too, and so does this, for equal outputs."""
        embeds, features = in_static_batches(self.encoder, tokens, self.static_batch)
        return tokens == 0, self.resizer(features.transpose(0, 1)), embeds.transpose(0, 1)


@torch.no_grad()
def fill_unset_text_parameters(text_module: nn.Module) -> None:
    """Give the two parameters sam3 builds with torch.empty and never initializes,
    `positional_embedding` and `text_projection`, open_clip's initial values (normal, std 0.01 and
    width ** -0.5) from the global generator, so that torch.manual_seed makes seeded weights
    reproducible. `text_module` is a text transformer holding them (sam3's or ours) or a text encoder
    whose `encoder` is one: the names are the same on both sides."""
    transformer = getattr(text_module, "encoder", text_module)
    nn.init.normal_(transformer.positional_embedding, std=0.01)
    nn.init.normal_(transformer.text_projection, std=transformer.width**-0.5)
