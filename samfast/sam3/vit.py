"""SAM 3's vision trunk: sam3.model.vitdet.ViT as sam3.model_builder builds it (_create_vit_backbone).

A plain ViT (ViTDet): 14 px patches without bias, an absolute position embedding trained at 336 px
(24 x 24 patches, plus a cls token's row that SAM 3 drops) tiled over the 72 x 72 grid, a LayerNorm
before the blocks, then 32 pre-norm blocks that attend within 24 x 24 windows except blocks 7, 15,
23 and 31, which attend over the whole grid. Every block rotates its queries and keys by 2-D RoPE
over the tokens it attends among; the global blocks scale their positions by 24 / 72, so that their
rotations span the range the windows were trained on (sam3's use_interp_rope).

Only that configuration's code paths are here (no rel-pos, no cls token carried through the blocks,
no LayerScale, no ln_post, eval only); parameter and buffer names and shapes are sam3's, so a sam3
state dict loads strictly. Attention runs through F.scaled_dot_product_attention, as in sam3, or
written out (`attn_impl`, samfast.modeling.attention: the fp32 stage's path, the sdpa switch's
counterpart); the rotations run in real arithmetic (samfast.modeling.rope), which inductor compiles, where sam3
multiplies complex tensors.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from samfast.modeling.attention import attention
from samfast.modeling.rope import apply_rotary_enc, axial_cis, rotations_of
from samfast.modeling.patch_embed import PatchEmbed
from samfast.modeling.windows import window_partition, window_unpartition


class ViT(nn.Module):
    """(B, 3, img_size, img_size) images -> [(B, embed_dim, grid, grid)]: the last global block's
    output, or with return_interm_layers every global block's. Defaults are SAM 3's sizes."""

    def __init__(
        self,
        img_size: int = 1008,
        pretrain_img_size: int = 336,
        patch_size: int = 14,
        in_chans: int = 3,
        embed_dim: int = 1024,
        depth: int = 32,
        num_heads: int = 16,
        mlp_ratio: float = 4.625,
        window_size: int = 24,
        global_att_blocks: tuple[int, ...] = (7, 15, 23, 31),
        return_interm_layers: bool = False,
    ) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.img_size = img_size
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        # sam3 builds the patch embedding without bias (bias_patch_embed=False)
        self.patch_embed.proj.register_parameter("bias", None)
        pretrain_grid = pretrain_img_size // patch_size
        # one row more than the grid: the pretraining cls token's, kept for the checkpoint's shape
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + pretrain_grid * pretrain_grid, embed_dim))
        grid = img_size // patch_size
        self.blocks = nn.ModuleList(
            Block(
                embed_dim,
                num_heads,
                mlp_ratio,
                window_size=0 if i in global_att_blocks else window_size,
                input_size=(grid, grid),
                rope_pt_size=window_size,
            )
            for i in range(depth)
        )
        # after the blocks, so that the state dict's keys come in sam3's order
        self.ln_pre = nn.LayerNorm(embed_dim)
        self.output_blocks = tuple(global_att_blocks) if return_interm_layers else (global_att_blocks[-1],)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.patch_embed(x)
        x = self.ln_pre(x + tiled_abs_pos(self.pos_embed, (x.shape[1], x.shape[2])))
        outputs = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in self.output_blocks:
                outputs.append(x.permute(0, 3, 1, 2))
        return outputs


def tiled_abs_pos(pos_embed: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(1, H, W, C): the (1, 1 + S * S, C) embedding's S x S grid (cls row dropped) repeated over H x W
    and cut to it (sam3's get_abs_pos with tiling, as SAM 3 calls it)."""
    h, w = hw
    size = math.isqrt(pos_embed.shape[1] - 1)
    grid = pos_embed[:, 1:].reshape(1, size, size, -1)
    if (size, size) == (h, w):
        return grid
    return grid.repeat(1, math.ceil(h / size), math.ceil(w / size), 1)[:, :h, :w]


class Block(nn.Module):
    """Pre-norm transformer block; attention within window_size x window_size windows (the map
    zero-padded up to a multiple of it) or, when window_size is 0, over the whole input_size map."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        window_size: int,
        input_size: tuple[int, int],
        rope_pt_size: int,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        attended = (window_size, window_size) if window_size > 0 else input_size
        # RoPE positions scaled by the trained size over the attended one (sam3's use_interp_rope)
        self.attn = Attention(dim, num_heads, attended, rope_scale=rope_pt_size / attended[0])
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.window_size = window_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.window_size > 0:
            hw = (x.shape[1], x.shape[2])
            windows, pad_hw = window_partition(x, self.window_size)
            x = window_unpartition(self.attn(windows), self.window_size, pad_hw, hw)
        else:
            x = self.attn(x)
        x = shortcut + x
        return x + self.mlp(self.norm2(x))


class Attention(nn.Module):
    """Multi-head self-attention over a (B, H, W, C) map, queries and keys rotated by 2-D RoPE.

    `freqs_cis` is sam3's complex (H * W, head_dim / 2) table under its name, so checkpoints carry it;
    the forward reads `rotations`, its real form, made again from freqs_cis whenever a state dict is
    loaded, so that the rotations used are the checkpoint's (as sam3 uses them)."""

    def __init__(self, dim: int, num_heads: int, input_size: tuple[int, int], rope_scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.rope_args = (dim // num_heads, *input_size)
        self.rope_scale = rope_scale
        self.attn_impl = "sdpa"  # "math" or "sdpa", set by the stages (samfast.stages)
        self.register_buffer("freqs_cis", self.rope_table())
        self.register_buffer("rotations", rotations_of(self.freqs_cis), persistent=False)
        self.register_load_state_dict_post_hook(_rotations_from_loaded_table)

    def rope_table(self) -> torch.Tensor:
        """sam3's freqs_cis for this block, computed (on the default device): what a checkpoint holds."""
        return axial_cis(*self.rope_args, scale=self.rope_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = apply_rotary_enc(q, k, self.rotations)
        x = attention(q, k, v, q.shape[-1] ** -0.5, self.attn_impl)
        return self.proj(x.transpose(1, 2).reshape(B, H, W, -1))


def _rotations_from_loaded_table(module: Attention, incompatible_keys) -> None:
    """load_state_dict's post-hook: the real rotations of the freqs_cis just loaded."""
    module.rotations = rotations_of(module.freqs_cis)


class Mlp(nn.Module):
    """fc2(gelu(fc1(x))): timm's Mlp as sam3's blocks use it (exact GELU, no dropout in eval)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))
