"""Hiera, SAM 2's trunk (https://arxiv.org/abs/2306.00989), with sam2's parameter names.

Four stages of blocks on a (B, H, W, C) map; the first block of stages 2-4 halves the resolution
by max-pooling its queries (q_pool) and doubles the width. Blocks attend within windows, except
the global blocks listed in the config. The positional embedding is a small background table
interpolated to the map's size plus a window-sized table tiled over it (windowed positional
embeddings, https://arxiv.org/abs/2311.05613).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast.kernels import norm_with_bias_channel, window_attention
from samfast.modeling.attention import attention
from samfast.modeling.common import linear_accumulate, linear_with_bias_channel
from samfast.modeling.windows import from_windows, to_windows, window_partition, window_unpartition
from samfast.sam2.mlp import HieraMLP


def pool_hw(x: torch.Tensor, pool: nn.Module | None) -> torch.Tensor:
    """Apply an NCHW pooling to a (B, H, W, C) map."""
    if pool is None:
        return x
    return pool(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def resized_pos_embed(table: torch.Tensor, window: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(1, H, W, C): the background table resized bicubically to (H, W), plus the window table tiled."""
    pos_embed = F.interpolate(table, size=hw, mode="bicubic")
    pos_embed = pos_embed + window.tile([p // w for p, w in zip(pos_embed.shape, window.shape)])
    return pos_embed.permute(0, 2, 3, 1)


def bicubic_matrix(n_in: int, n_out: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(n_out, n_in): F.interpolate's bicubic resize of an axis of n_in to n_out as a matrix (its
    weights and its clamping at the borders), made by F.interpolate itself from the identity; the
    other axis keeps its size 1, which bicubic leaves as it is."""
    eye = torch.eye(n_in, device=device, dtype=dtype).view(1, n_in, n_in, 1)
    return F.interpolate(eye, size=(n_out, 1), mode="bicubic")[0, :, :, 0].T


def tiling_matrix(n_in: int, n_out: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(n_out, n_in) of zeros and ones: an axis of n_in tiled to n_out (row i picks i % n_in)."""
    return (torch.arange(n_out, device=device)[:, None] % n_in == torch.arange(n_in, device=device)).to(dtype)


def resize_and_tile_matrix(n: int, n_window: int, n_out: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(n_out, n + n_window): [bicubic_matrix | tiling_matrix] for one axis, the table's n entries
    first and the window's n_window after them."""
    return torch.cat([bicubic_matrix(n, n_out, device, dtype), tiling_matrix(n_window, n_out, device, dtype)], 1)


def resized_pos_embed_by_matmul(table: torch.Tensor, window: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """resized_pos_embed as two small matrix products (fp32 at least), written channels last (1, H, W, C).

    Both parts are linear and separable in the two axes: the table resized is rows @ table @ cols^T
    (bicubic_matrix) and the window tiled is tile_rows @ window @ tile_cols^T (tiling_matrix), so their
    sum is [rows | tile_rows] @ [[table, 0], [0, window]] @ [cols | tile_cols]^T for each channel.
    Inlined, inductor computed the bicubic taps inside the first block's layer norm for every image
    of the batch and read the (1, C, H, W) tables channel-major across the norm's channel reduction;
    in ATen's bicubic kernel each thread loops over the channels (docs/history/sam2-encoder-speed.md,
    8f8c4b4 and fa5d95c). A product's output is no expression inductor
    inlines, and this one comes out channels last, so the norm reads the table along its channels.
    One rounding to the table's dtype where F.interpolate and the sum make two. Computed on every
    call, so that a change to the two tables is always seen."""
    exact = torch.promote_types(table.dtype, torch.float32)
    (h, w), (wh, ww), c = table.shape[-2:], window.shape[-2:], table.shape[1]
    left = resize_and_tile_matrix(h, wh, hw[0], table.device, exact)
    right = resize_and_tile_matrix(w, ww, hw[1], table.device, exact)
    both = F.pad(table[0], (0, ww, 0, wh)) + F.pad(window[0], (w, 0, h, 0))  # (C, h + wh, w + ww), block-diagonal
    by_rows = left @ both.permute(1, 2, 0).to(exact).reshape(h + wh, -1)  # (H, (w + ww) * C)
    return (right @ by_rows.view(hw[0], w + ww, c)).to(table.dtype).unsqueeze(0)


class PatchEmbed(nn.Module):
    """A 7x7 stride-4 convolution: (B, 3, 1024, 1024) -> (B, 256, 256, C), channels last.

    With `as_gemm` (set by the compile switch) the same product runs as one matrix multiply over
    unfolded patches. cuDNN runs this convolution of a 3-channel input with a generic kernel plus
    layout conversions, slow for its 22 GFLOP (docs/history/sam2-encoder-speed.md, 611658c). The
    7x7 taps are widened to 8x8 with a zero first row and column (and the input padded by one more
    at the top and left to match), so each patch holds 3 * 8 * 8 = 192 values: a GEMM depth that
    keeps bf16 rows 16-byte aligned (147 would not). The weights keep the conv layout.
    """

    def __init__(self, embed_dim: int, in_chans: int = 3) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=7, stride=4, padding=3)
        self.as_gemm = False

    def output_size(self, hw: tuple[int, int]) -> tuple[int, int]:
        """The (H, W) of the patch map of an (H, W) input."""
        (k, _), (s, _), (p, _) = self.proj.kernel_size, self.proj.stride, self.proj.padding
        return tuple((n + 2 * p - k) // s + 1 for n in hw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.as_gemm:
            return self.proj(x).permute(0, 2, 3, 1)
        (k, _), (s, _), (p, _) = self.proj.kernel_size, self.proj.stride, self.proj.padding
        h_out, w_out = self.output_size(x.shape[-2:])
        # output i reads input rows s*i - p .. s*i - p + k - 1; one zero tap in front makes k + 1 = 8
        # taps starting at s*i - p - 1, so the input gets p + 1 rows in front and enough behind
        window = k + 1
        bottom, right = (s * (n_out - 1) + window - (n + p + 1) for n, n_out in zip(x.shape[-2:], (h_out, w_out)))
        x = F.pad(x, (p + 1, right, p + 1, bottom))
        patches = x.unfold(2, window, s).unfold(3, window, s)  # (B, C, h_out, w_out, 8, 8)
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(*patches.shape[:1], h_out, w_out, -1)
        weight = F.pad(self.proj.weight, (1, 0, 1, 0)).reshape(self.proj.out_channels, -1)
        return F.linear(patches, weight, self.proj.bias)


def linear_maybe_with_bias_channel(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """linear(x), where x is the linear's input or that input with the channel of ones after it
    (kernels.norm_with_bias_channel; then the bias is that channel's weight column)."""
    return linear(x) if x.shape[-1] == linear.in_features else linear_with_bias_channel(x, linear)


class MultiScaleAttention(nn.Module):
    """Multi-head attention over the tokens of a window; with q_pool, the queries are pooled first,
    so the output has the pooled resolution."""

    def __init__(self, dim: int, dim_out: int, num_heads: int, q_pool: nn.Module | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_pool = q_pool
        self.qkv = nn.Linear(dim, dim_out * 3)
        self.proj = nn.Linear(dim_out, dim_out)
        self.scale = (dim_out // num_heads) ** -0.5
        # "sdpa" is sam2's own path (its outputs to the bit); the stages set "math" for fp32, SAM 1's
        # reference order, which equals it to fp32 rounding (tests/unit/test_sam2_stages.py), and the
        # triton switch "triton" where the windows are small (samfast.kernels.window_attention)
        self.attn_impl = "sdpa"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.attend(x))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """The attention's output before its projection, (B, h, w, dim_out) (h, w pooled with q_pool); x
        may carry the channel of ones for the biases (MultiScaleBlock.bias_as_channel)."""
        b, h, w, _ = x.shape
        q, k, v = linear_maybe_with_bias_channel(x, self.qkv).reshape(b, h * w, 3, self.num_heads, -1).unbind(2)
        if self.q_pool is not None:
            q = pool_hw(q.reshape(b, h, w, -1), self.q_pool)
            h, w = q.shape[1:3]
            q = q.reshape(b, h * w, self.num_heads, -1)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.attn_impl == "triton":
            x = window_attention(q, k, v, self.scale)
        else:
            x = attention(q, k, v, self.scale, self.attn_impl)
        return x.transpose(1, 2).reshape(b, h, w, -1)


class MultiScaleBlock(nn.Module):
    """Pre-norm attention (windowed when window_size > 0) and MLP; with q_stride it also pools
    the residual, projected to the new width."""

    def __init__(
        self, dim: int, dim_out: int, num_heads: int, q_stride: tuple[int, int] | None, window_size: int
    ) -> None:
        super().__init__()
        self.dim, self.dim_out = dim, dim_out
        self.window_size = window_size
        self.q_stride = q_stride
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.pool = nn.MaxPool2d(kernel_size=q_stride, stride=q_stride) if q_stride else None
        self.attn = MultiScaleAttention(dim, dim_out, num_heads, q_pool=self.pool)
        self.norm2 = nn.LayerNorm(dim_out, eps=1e-6)
        self.mlp = HieraMLP(dim_out, 4 * dim_out)
        if dim != dim_out:
            self.proj = nn.Linear(dim, dim_out)
        # set by the triton switch where it pays (SAM2Base.bias_channel_blocks): forward_windowed's first
        # norm then writes a channel of ones, and qkv and proj take their biases as its weight column
        self.bias_as_channel = False

    def window_tokens(self) -> tuple[int, int] | None:
        """(queries, keys) of each window the attention sees; None for a global block (the whole map)."""
        if self.window_size == 0:
            return None
        keys = self.window_size**2
        return (keys // (self.q_stride[0] * self.q_stride[1]) if self.q_stride else keys), keys

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.dim != self.dim_out:
            shortcut = pool_hw(self.proj(x), self.pool)

        window_size = self.window_size
        if window_size > 0:
            h, w = x.shape[1:3]
            x, pad_hw = window_partition(x, window_size)
        x = self.attn(x)
        if self.q_stride:
            # the queries were pooled: the windows and the map shrank by the stride
            window_size = self.window_size // self.q_stride[0]
            h, w = shortcut.shape[1:3]
            pad_hw = (h + (window_size - h % window_size) % window_size, w + (window_size - w % window_size) % window_size)
        if self.window_size > 0:
            x = window_unpartition(x, window_size, pad_hw, (h, w))

        x = shortcut + x
        return self.mlp.add_to(x, self.norm2(x))

    def forward_windowed(self, stream: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """forward on Hiera's residual stream kept in window order (Hiera.forward_windowed): the map
        is stream + bias, stream (B, nh, nw, w, w, C) its w x w windows (w this block's window size,
        or any for a global block) and bias a (C,) sum of biases not yet added. Both residuals
        accumulate inside their GEMMs (the attention's projection, lin2) and the biases of those
        GEMMs join `bias`, which the layer norms add as they read. Returns the new (stream, bias),
        the stream in windows of the pooled size after a q_pool block; stream is updated in place."""
        b, nh, nw, w, _, _ = stream.shape
        if self.bias_as_channel:
            x = norm_with_bias_channel(stream, bias, self.norm1.weight, self.norm1.bias, self.norm1.eps)
        else:
            x = self.norm1(stream + bias)
        c = x.shape[-1]
        if self.dim != self.dim_out:
            # pooling 2 x 2 cells within windows of even size is pooling the map
            stream = pool_hw(linear_maybe_with_bias_channel(x, self.proj).view(-1, w, w, self.dim_out), self.pool)
            stream = stream.view(b, nh, nw, *stream.shape[1:])
            bias = torch.zeros_like(self.proj.bias)
        # a global block attends over every token of its image, in whatever order they are stored
        tokens = x.view(-1, w, w, c) if self.window_size > 0 else x.view(b, nh * nw * w, w, c)
        linear_accumulate(stream, self.attn.attend(tokens), self.attn.proj.weight)
        bias = bias + self.attn.proj.bias
        self.mlp.accumulate_unbiased(stream, self.norm2(stream + bias))
        return stream, bias + self.mlp.layers[1].bias


class Hiera(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        stages: tuple[int, ...],
        global_att_blocks: tuple[int, ...],
        window_pos_embed_bkg_spatial_size: tuple[int, int],
        window_spec: tuple[int, ...],
        q_pool: int = 3,
        q_stride: tuple[int, int] = (2, 2),
    ) -> None:
        super().__init__()
        self.stage_ends = [sum(stages[:i]) - 1 for i in range(1, len(stages) + 1)]
        q_pool_blocks = [end + 1 for end in self.stage_ends[:-1]][:q_pool]
        self.patch_embed = PatchEmbed(embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, embed_dim, *window_pos_embed_bkg_spatial_size))
        self.pos_embed_window = nn.Parameter(torch.zeros(1, embed_dim, window_spec[0], window_spec[0]))
        self.pos_embed_by_matmul = False  # set by the compile switch: see resized_pos_embed_by_matmul

        self.blocks = nn.ModuleList()
        stage = 0
        for i in range(sum(stages)):
            dim_out = embed_dim
            # The first block of a stage still uses the previous stage's window (its input's
            # resolution); its pooled output is in the new stage's window size.
            window_size = 0 if i in global_att_blocks else window_spec[stage]
            if i - 1 in self.stage_ends:
                dim_out, num_heads, stage = 2 * embed_dim, 2 * num_heads, stage + 1
            self.blocks.append(
                MultiScaleBlock(
                    embed_dim,
                    dim_out,
                    num_heads,
                    q_stride=q_stride if i in q_pool_blocks else None,
                    window_size=window_size,
                )
            )
            embed_dim = dim_out
        self.channel_list = [self.blocks[i].dim_out for i in self.stage_ends[::-1]]

    def _get_pos_embed(self, hw: tuple[int, int]) -> torch.Tensor:
        if self.pos_embed_by_matmul:
            return resized_pos_embed_by_matmul(self.pos_embed, self.pos_embed_window, hw)
        return resized_pos_embed(self.pos_embed, self.pos_embed_window, hw)

    def output_sizes(self, hw: tuple[int, int]) -> list[tuple[int, int]]:
        """The (H, W) of each output of forward for an input of size hw, by shape arithmetic alone."""
        size = self.patch_embed.output_size(hw)
        sizes = []
        for i, block in enumerate(self.blocks):
            if block.q_stride:
                size = tuple(n // q for n, q in zip(size, block.q_stride))
            if i in self.stage_ends:
                sizes.append(size)
        return sizes

    def keeps_window_order(self, hw: tuple[int, int]) -> bool:
        """Whether forward runs forward_windowed for a (H, W) patch map: on the "epilogue" MLP path (the
        compile switch on bf16, where the residuals join GEMMs) when every window tiles its map
        without padding (hiera_l at 1024; sam2 zero-pads ragged windows after each layer norm, which
        a stream kept in windows would not)."""
        return all(block.mlp.gelu_impl == "epilogue" for block in self.blocks) and self.windows_tile(hw)

    def windows_tile(self, hw: tuple[int, int]) -> bool:
        """Whether every block's windows tile its map of a (H, W) patch map without padding, and the first
        block is windowed (the window-order stream starts in its windows)."""
        if not self.blocks[0].window_size:
            return False
        for block in self.blocks:
            if block.window_size and any(n % block.window_size for n in hw):
                return False
            if block.q_stride:
                if block.window_size == 0 or block.window_size % block.q_stride[0] or any(n % q for n, q in zip(hw, block.q_stride)):
                    return False
                hw = tuple(n // q for n, q in zip(hw, block.q_stride))
        return True

    def forward_windowed(self, x: torch.Tensor) -> list[torch.Tensor]:
        """forward with the residual stream kept in each block's window order from block to block
        (MultiScaleBlock.forward_windowed): a windowed block's attention then reads and its
        projection accumulates into the stream as stored, so each block makes two memory-bound
        passes over it (the two layer norms) where forward made three, and the windows are cut
        only where the window size changes. The stage outputs come back in map order."""
        stream, bias = to_windows(x, self.blocks[0].window_size), x.new_zeros(x.shape[-1])
        outputs = []
        for i, block in enumerate(self.blocks):
            if block.window_size and block.window_size != stream.shape[3]:
                stream = to_windows(from_windows(stream), block.window_size)
            stream, bias = block.forward_windowed(stream, bias)
            if i in self.stage_ends:
                outputs.append(from_windows(stream + bias).permute(0, 3, 1, 2))
        return outputs

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each stage's last output, NCHW, highest resolution first (strides 4, 8, 16, 32)."""
        x = self.patch_embed(x)
        x = x + self._get_pos_embed(x.shape[1:3])
        if self.keeps_window_order(x.shape[1:3]):
            return self.forward_windowed(x)
        outputs = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in self.stage_ends:
                outputs.append(x.permute(0, 3, 1, 2))
        return outputs
