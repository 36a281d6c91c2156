"""SAM 3's segmentation head (sam3.model.maskformer_segmentation.UniversalSegmentationHead with its PixelDecoder,
as sam3's model builder configures them): the detector's queries and encoded image into mask logits.

The encoded image tokens first attend to the prompt (text and geometry tokens) and keep that as a
residual; they replace the coarsest backbone level, and the pixel decoder walks up the finer levels
(nearest upsampling, add, 3x3 conv, GroupNorm, ReLU). A 1x1 conv gives the per-pixel instance embedding,
whose dot product with an MLP of each query is that query's mask logits; another 1x1 conv gives the
semantic segmentation logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast.modeling.mask_decoder import MLP
from samfast.sam3.multihead_attention import MultiheadAttention, seq_first


class PixelDecoder(nn.Module):
    def __init__(self, hidden_dim: int = 256, num_upsampling_stages: int = 3) -> None:
        super().__init__()
        self.conv_layers = nn.ModuleList(nn.Conv2d(hidden_dim, hidden_dim, 3, 1, 1) for _ in range(num_upsampling_stages))
        self.norms = nn.ModuleList(nn.GroupNorm(8, hidden_dim) for _ in range(num_upsampling_stages))

    def forward(self, backbone_feats: list[torch.Tensor]) -> torch.Tensor:
        """Feature levels (B, C, H, W), finest first, all of C = hidden_dim -> (B, C, H, W) at the finest level.

        sam3's image model passes three levels, so the third stage's conv and norm (in its checkpoint) go unused."""
        finer = backbone_feats[-2::-1]
        if len(finer) > len(self.conv_layers):
            raise ValueError(
                f"{len(backbone_feats)} feature levels need {len(finer)} upsampling stages, this decoder has "
                f"{len(self.conv_layers)}: build it with num_upsampling_stages={len(finer)} or pass fewer levels"
            )
        x = backbone_feats[-1]
        for conv, norm, feat in zip(self.conv_layers, self.norms, finer):
            x = feat + F.interpolate(x, size=feat.shape[-2:], mode="nearest")
            x = F.relu(norm(conv(x)))
        return x


class MaskPredictor(nn.Module):
    """Holds the queries' MLP under sam3's name (mask_predictor.mask_embed.layers.{0,1,2})."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.mask_embed = MLP(hidden_dim, hidden_dim, hidden_dim, 3)

    def forward(self, queries: torch.Tensor, pixel_embed: torch.Tensor) -> torch.Tensor:
        """queries (B, Q, C), pixel_embed (B, C, H, W) -> mask logits (B, Q, H, W)."""
        return torch.einsum("bqc,bchw->bqhw", self.mask_embed(queries), pixel_embed)


class UniversalSegmentationHead(nn.Module):
    def __init__(self, hidden_dim: int = 256, upsampling_stages: int = 3, num_heads: int = 8) -> None:
        super().__init__()
        self.d_model = hidden_dim
        self.pixel_decoder = PixelDecoder(hidden_dim, upsampling_stages)
        self.mask_predictor = MaskPredictor(hidden_dim)
        self.cross_attend_prompt = MultiheadAttention(hidden_dim, num_heads)
        self.cross_attn_norm = nn.LayerNorm(hidden_dim)
        self.semantic_seg_head = nn.Conv2d(hidden_dim, 1, kernel_size=1)
        self.instance_seg_head = nn.Conv2d(hidden_dim, hidden_dim, kernel_size=1)

    def forward(
        self,
        backbone_feats: list[torch.Tensor],
        obj_queries: torch.Tensor,
        image_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        prompt: torch.Tensor,
        prompt_mask: torch.Tensor,
    ) -> dict[str, torch.Tensor | None]:
        """sam3's signature and outputs.

        backbone_feats: the backbone's levels (n_images, C, H, W), finest first; obj_queries
        (layers, B, Q, C) the decoder's queries, of which the last layer's are used; image_ids (B,) the image
        of each of the B prompts; encoder_hidden_states (HW, B, C) the fusion encoder's image tokens (HW of
        the coarsest level); prompt (P, B, C) and prompt_mask (B, P) the prompt tokens and their padding.

        Returns pred_masks (B, Q, H, W) and semantic_seg (B, 1, H, W) logits at the finest level, and
        presence_logit None (the head is built without a presence head; sam3's model copies the key as is).
        """
        attended = seq_first(
            self.cross_attend_prompt, self.cross_attn_norm(encoder_hidden_states), prompt, prompt, prompt_mask
        )
        encoder_hidden_states = attended + encoder_hidden_states
        pixel_embed = self.pixel_decoder(self._levels(backbone_feats, image_ids, encoder_hidden_states))
        return {
            "pred_masks": self.mask_predictor(obj_queries[-1], self.instance_seg_head(pixel_embed)),
            "semantic_seg": self.semantic_seg_head(pixel_embed),
            "presence_logit": None,
        }

    @staticmethod
    def _levels(
        backbone_feats: list[torch.Tensor], image_ids: torch.Tensor, encoder_hidden_states: torch.Tensor
    ) -> list[torch.Tensor]:
        """The pixel decoder's input: the finer levels of each prompt's image, then the encoded image tokens
        as the coarsest level. One image broadcasts over the prompts instead of being copied per prompt."""
        coarsest = backbone_feats[-1]
        finer = backbone_feats[:-1]
        if coarsest.shape[0] > 1:
            finer = [feat[image_ids] for feat in finer]
        height, width = coarsest.shape[-2:]
        encoded = encoder_hidden_states.permute(1, 2, 0)[..., : height * width].unflatten(-1, (height, width))
        return [*finer, encoded]
