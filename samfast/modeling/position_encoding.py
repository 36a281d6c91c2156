"""The sine positional encoding of SAM 2's and SAM 3's feature maps (sam2.modeling.position_encoding.PositionEmbeddingSine, sam3.model.position_encoding's with normalize=True).

Normalized (positions 1..H divided by H + 1e-6, times 2 pi), half the channels for y then half for x,
interleaved sin/cos. It depends only on the map's size, so each size is computed once and cached:
the neck asks for the same three or four sizes on every image. It is cast to the map's dtype before
it is expanded over the batch: cast after, it was a (B, 256, 256, 256) bf16 copy per call, sine and
cosine computed per element (docs/history/sam2-encoder-speed.md, deb8683).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def made_for_inference_only(cached: torch.Tensor) -> bool:
    """A cached tensor made under inference mode (a predictor's call) that a call outside it would
    use: autograd cannot save it for backward (tinysam.train_tracking trains after validating), so
    the cache is made again. Eager calls only: dynamo cannot trace is_inference(), and a compiled
    graph reads its caches as constants and never trains."""
    return (not torch.compiler.is_compiling() and cached.is_inference()
            and not torch.is_inference_mode_enabled())


class PositionEmbeddingSine(nn.Module):
    def __init__(self, num_pos_feats: int, temperature: int = 10000) -> None:
        super().__init__()
        self.num_pos_feats = num_pos_feats // 2
        self.temperature = temperature
        self.scale = 2 * math.pi
        self._cache: dict[tuple[int, int, torch.device, torch.dtype], torch.Tensor] = {}

    def _encode(self, h: int, w: int, device: torch.device) -> torch.Tensor:
        """(C, H, W), with the reference's operation order so it equals it bit for bit."""
        y_embed = torch.arange(1, h + 1, dtype=torch.float32, device=device).view(-1, 1).repeat(1, w)
        x_embed = torch.arange(1, w + 1, dtype=torch.float32, device=device).view(1, -1).repeat(h, 1)
        eps = 1e-6
        y_embed = y_embed / (y_embed[-1:, :] + eps) * self.scale
        x_embed = x_embed / (x_embed[:, -1:] + eps) * self.scale
        dim_t = torch.arange(self.num_pos_feats, dtype=torch.float32, device=device)
        dim_t = self.temperature ** (2 * (dim_t // 2) / self.num_pos_feats)
        pos_x = x_embed[:, :, None] / dim_t
        pos_y = y_embed[:, :, None] / dim_t
        pos_x = torch.stack((pos_x[:, :, 0::2].sin(), pos_x[:, :, 1::2].cos()), dim=3).flatten(2)
        pos_y = torch.stack((pos_y[:, :, 0::2].sin(), pos_y[:, :, 1::2].cos()), dim=3).flatten(2)
        return torch.cat((pos_y, pos_x), dim=2).permute(2, 0, 1)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) encoding for a (B, *, H, W) map, in x's dtype (computed in fp32, as sam2 does,
        then cast): one (C, H, W) tensor expanded over the batch."""
        key = (x.shape[-2], x.shape[-1], x.device, x.dtype)
        encoding = self._cache.get(key)
        if encoding is None or made_for_inference_only(encoding):
            encoding = self._encode(*key[:3]).to(x.dtype)
            if not torch.compiler.is_compiling():
                # a cache filled while tracing fails dynamo's guard on it next call: a graph computes
                # what was not cached before it was compiled (fill_cache) on every call
                self._cache[key] = encoding
        return encoding[None].expand(x.shape[0], -1, -1, -1)

    def fill_cache(self, hw: tuple[int, int], device: torch.device, dtype: torch.dtype) -> None:
        """Compute the encoding of an (H, W) map now, so that a graph compiled after this reads it
        as a constant, not the sines and cosines computed at every call
        (docs/history/sam2-encoder-speed.md, 611658c)."""
        key = (*hw, device, dtype)
        if key not in self._cache:
            self._cache[key] = self._encode(*hw, device).to(dtype)


def get_1d_sine_pe(pos_inds: torch.Tensor, dim: int, temperature: int = 10000) -> torch.Tensor:
    """(..., dim) sine / cosine encoding of (fractional) positions, sam2's order (the object
    pointers' temporal encoding)."""
    pe_dim = dim // 2
    dim_t = torch.arange(pe_dim, dtype=torch.float32, device=pos_inds.device)
    dim_t = temperature ** (2 * (dim_t // 2) / pe_dim)
    pos_embed = pos_inds.unsqueeze(-1) / dim_t
    return torch.cat([pos_embed.sin(), pos_embed.cos()], dim=-1)
