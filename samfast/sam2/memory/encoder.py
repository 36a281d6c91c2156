"""SAM 2's memory encoder: a frame's features fused with its predicted mask into a 64-channel memory."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast.kernels.mask_downsample import MAX_INPUT_CHANNELS, downsample_conv
from samfast.modeling.common import LayerNorm2d, gelu_mlp
from samfast.sam2.memory.static_graphs import compile_per_object_count
from samfast.modeling.position_encoding import PositionEmbeddingSine


class MaskDownSampler(nn.Module):
    """Four stride-2 3x3 convs (x4 channels each, LayerNorm2d, GELU), then a 1x1 conv to embed_dim:
    a 1024x1024 mask to the 64x64 feature grid. `interpol_size` (SAM 3's tracker: 1152 x 1152, for its
    72 x 72 grid): masks of another size are first resized to it, bilinear with antialiasing, as sam3's
    SimpleMaskDownSampler does (sam3/model/memory.py).

    `conv_impl` "triton" (the triton switch): the map channels-last throughout; each stride-2 conv of few
    input channels (sam2's first two) with its norm and GELU one kernel (kernels.downsample_conv: cuDNN's grouped
    kernels were slow there), the wider ones on cuDNN, the 1x1 conv the GEMM it is.
    """

    def __init__(self, embed_dim: int = 256, num_layers: int = 4, stride: int = 2,
                 interpol_size: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.interpol_size = None if interpol_size is None else tuple(interpol_size)
        self.encoder = nn.Sequential()
        channels = 1
        for _ in range(num_layers):
            out = channels * stride**2
            self.encoder.append(nn.Conv2d(channels, out, kernel_size=3, stride=stride, padding=1))
            self.encoder.append(LayerNorm2d(out))
            self.encoder.append(nn.GELU())
            channels = out
        self.encoder.append(nn.Conv2d(channels, embed_dim, kernel_size=1))
        self.conv_impl = "module"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.interpol_size is not None and tuple(x.shape[-2:]) != self.interpol_size:
            x = F.interpolate(x.float(), size=self.interpol_size, mode="bilinear", align_corners=False, antialias=True)
        if self.conv_impl != "triton":
            return self.encoder(x)
        y = x.permute(0, 2, 3, 1)  # (B, H, W, C); one channel: a view
        for i in range(0, len(self.encoder) - 1, 3):
            conv, norm, act = self.encoder[i], self.encoder[i + 1], self.encoder[i + 2]
            if conv.in_channels <= MAX_INPUT_CHANNELS and conv.stride == (2, 2):  # the kernel's stride
                y = downsample_conv(y, conv.weight, conv.bias, norm.weight, norm.bias, norm.eps)
            else:
                y = act(norm(conv(y.permute(0, 3, 1, 2)).permute(0, 2, 3, 1), channels_last=True))
        return _pointwise(self.encoder[-1], y.permute(0, 3, 1, 2))


class CXBlock(nn.Module):
    """ConvNeXt block: depthwise 7x7 conv, LayerNorm2d, pointwise MLP (as Linears), layer scale, residual.

    The compile switch on a bf16 tracker (samfast.sam2.video_predictor.compile_tracking) sets two paths:
    `channels_last`: the depthwise conv reads its input channels-last and the norm runs over the
    contiguous channels: cuDNN's channels-last depthwise kernel is the faster one
    (docs/measurements/video/memory-encoder-micro-h200-2026-11-27.md); the residual then stays
    channels-last for the next block.
    `gelu_impl` "epilogue": pwconv1 and its GELU as one GEMM, the tanh form (samfast.modeling.common.gelu_mlp).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = LayerNorm2d(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))
        self.channels_last = False
        self.gelu_impl = "module"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)  # a no-op from the second block on
            y = self.norm(self.dwconv(x).permute(0, 2, 3, 1), channels_last=True)
        else:
            y = self.norm(self.dwconv(x)).permute(0, 2, 3, 1)
        y = self.gamma * gelu_mlp(y, self.pwconv1, self.pwconv2, self.act, self.gelu_impl)
        return x + y.permute(0, 3, 1, 2)


class Fuser(nn.Module):
    def __init__(self, dim: int, num_layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CXBlock(dim) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MemoryEncoder(nn.Module):
    def __init__(self, out_dim: int, in_dim: int = 256, interpol_size: tuple[int, int] | None = None) -> None:
        """interpol_size: the mask downsampler's (MaskDownSampler)."""
        super().__init__()
        self.mask_downsampler = MaskDownSampler(in_dim, interpol_size=interpol_size)
        self.pix_feat_proj = nn.Conv2d(in_dim, in_dim, kernel_size=1)
        self.fuser = Fuser(in_dim)
        self.position_encoding = PositionEmbeddingSine(out_dim)
        self.out_proj = nn.Conv2d(in_dim, out_dim, kernel_size=1)
        self.compiled_encode = None  # set by compile_static (the compile switch)
        # the compile switch on a bf16 tracker (samfast.sam2.video_predictor.compile_tracking): the map channels-last
        # from the frame's features to the memory, its 1x1 convs as the GEMMs they are (_pointwise), the
        # fuser's blocks channels-last too (CXBlock)
        self.channels_last = False

    def compile_static(self, mode: str) -> None:
        """torch.compile the encoder: a static graph for one object, one for every larger batch (static_graphs)."""
        self.compiled_encode = compile_per_object_count(self.encode, mode, {0: 0, 1: 0})  # pix_feat, masks

    def forward(
        self, pix_feat: torch.Tensor, masks: torch.Tensor, skip_mask_sigmoid: bool = False
    ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """pix_feat (B, 256, 64, 64), mask logits (B, 1, 1024, 1024) -> sam2's dict of the memory and its encoding."""
        encode = self.encode if self.compiled_encode is None else self.compiled_encode
        return encode(pix_feat, masks, skip_mask_sigmoid)

    def encode(
        self, pix_feat: torch.Tensor, masks: torch.Tensor, skip_mask_sigmoid: bool
    ) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        if not skip_mask_sigmoid:
            masks = torch.sigmoid(masks)
        masks = self.mask_downsampler(masks)
        if self.channels_last:
            x = _pointwise(self.pix_feat_proj, pix_feat.to(masks.device)) + masks
            x = _pointwise(self.out_proj, self.fuser(x))
        else:
            x = self.pix_feat_proj(pix_feat.to(masks.device)) + masks
            x = self.out_proj(self.fuser(x))
        return {"vision_features": x, "vision_pos_enc": [self.position_encoding(x)]}


def _pointwise(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """A 1x1 conv as a linear map over the channels of the channels-last map: one GEMM where the map is
    channels-last (the tracker's frame features are: tokens-first), the result channels-last. Measured
    only together with the memory attention's keys kept apart (attention.RoPEAttention):
    docs/history/figures-from-docstrings.md."""
    weight = conv.weight.view(conv.out_channels, conv.in_channels)
    return F.linear(x.permute(0, 2, 3, 1), weight, conv.bias).permute(0, 3, 1, 2)
