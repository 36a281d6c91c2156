"""SAM 3's image model (sam3.model.sam3_image.Sam3Image) for inference: phrases, boxes and points in,
scored boxes and masks of every instance of the concept out.

The parts, each its own module under sam3's names (so that sam3's Sam3Image state dict loads with
strict=True, key for key): `backbone` (the ViT and its neck, the text encoder: sam3's
SAM3VLBackbone), `geometry_encoder` (box and point prompts as tokens), `transformer` (the fusion
encoder and the DETR decoder), `segmentation_head` (masks from the queries), `dot_prod_scoring`
(each query's logit against the prompt).

`forward_grounding` is Sam3Image.forward_grounding in eval mode: the prompt is the text tokens then
the geometry tokens; the image tokens attend to it in the encoder; the decoder's queries, its boxes
refined layer by layer, are scored by their dot product with the prompt, and a presence token gives
one logit per prompt that the concept is in the image at all. An instance's score is
sigmoid(logit) * sigmoid(presence) (`detection_scores`). sam3 also scores and boxes every decoder
layer for its training losses and keeps only the last in eval: here only the last layer is scored
and boxed (the same numbers, elementwise per layer). sam3 rounds the tracker's backbone features to
bf16 only in its multi-GPU video detector (Sam3ImageOnVideoMultiGPU, for an all-gather); the image
outputs never pass through that rounding, so nothing here rounds.

No host syncs in forward_grounding: the prompts of a batch index their images and phrases by
integer tensors (gathers), the padding stays in the sequences, masked in the attentions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from samfast.sam3.boxes import box_cxcywh_to_xyxy, inverse_sigmoid
from samfast.sam3.detr_decoder import DetrDecoder
from samfast.sam3.fusion_encoder import FusionEncoder
from samfast.sam3.geometric_prompt import Prompt
from samfast.sam3.geometry_encoder import SequenceGeometryEncoder
from samfast.sam3.neck import Sam3DualViTDetNeck
from samfast.sam3.scoring import DotProductScoring
from samfast.sam3.segmentation_head import UniversalSegmentationHead
from samfast.sam3.text import TextEncoder


class VisionLanguageBackbone(nn.Module):
    """sam3's SAM3VLBackbone: the vision backbone and the text encoder side by side, no fusion, with
    its output dicts. `scalp` coarsest neck levels are dropped (SAM 3 drops the 0.5x one)."""

    def __init__(self, visual: Sam3DualViTDetNeck, text: TextEncoder, scalp: int = 1) -> None:
        super().__init__()
        self.vision_backbone = visual
        self.language_backbone = text
        self.scalp = scalp

    def forward_image(self, images: torch.Tensor) -> dict:
        """(B, 3, H, W) normalized images -> backbone_fpn (the levels, finest first), vision_pos_enc
        (their sine encodings), vision_features (the coarsest kept level) and sam2_backbone_out (the
        second branch's, or None without it)."""
        sam3_feats, sam3_pos, sam2_feats, sam2_pos = self.vision_backbone(images)
        keep = slice(None, -self.scalp if self.scalp > 0 else None)
        sam2_out = None
        if sam2_feats is not None:
            sam2_feats, sam2_pos = sam2_feats[keep], sam2_pos[keep]
            sam2_out = {"vision_features": sam2_feats[-1], "vision_pos_enc": sam2_pos, "backbone_fpn": sam2_feats}
        sam3_feats, sam3_pos = sam3_feats[keep], sam3_pos[keep]
        return {
            "vision_features": sam3_feats[-1],
            "vision_pos_enc": sam3_pos,
            "backbone_fpn": sam3_feats,
            "sam2_backbone_out": sam2_out,
        }

    def forward_text(self, captions: list[str], device: torch.device | str | None = None) -> dict:
        """Phrases -> language_features (L, P, C), language_mask (P, L) True on padding,
        language_embeds (L, P, width) the token embeddings."""
        mask, features, embeds = self.language_backbone(list(captions), device=device)
        return {"language_features": features, "language_mask": mask, "language_embeds": embeds}


class DetectorTransformer(nn.Module):
    """The `transformer` of sam3's Sam3Image (its TransformerWrapper): holds the fusion encoder and the
    DETR decoder under their names; it has no parameters of its own."""

    def __init__(self, encoder: FusionEncoder, decoder: DetrDecoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.d_model = decoder.d_model


@dataclass
class FindInput:
    """Which image and which phrase each prompt of a batch takes (sam3's FindStage, its two fields that
    inference reads): img_ids (P,) indices into the backbone's images, text_ids (P,) into its phrases."""

    img_ids: torch.Tensor
    text_ids: torch.Tensor


class Sam3ImageModel(nn.Module):
    def __init__(
        self,
        backbone: VisionLanguageBackbone,
        geometry_encoder: SequenceGeometryEncoder,
        transformer: DetectorTransformer,
        segmentation_head: UniversalSegmentationHead,
        dot_prod_scoring: DotProductScoring,
    ) -> None:
        super().__init__()
        # registered in sam3's order: the state dict's parts come in sam3's order
        self.backbone = backbone
        self.geometry_encoder = geometry_encoder
        self.transformer = transformer
        self.segmentation_head = segmentation_head
        self.dot_prod_scoring = dot_prod_scoring

    @property
    def device(self) -> torch.device:
        return self.dot_prod_scoring.hs_proj.weight.device

    def empty_prompt(self, num_prompts: int = 1) -> Prompt:
        """A geometric prompt with no boxes and no points for each of `num_prompts` prompts (sam3's
        _get_dummy_prompt): what a text-only query passes."""
        return Prompt(
            box_embeddings=torch.zeros(0, num_prompts, 4, device=self.device),
            box_mask=torch.zeros(num_prompts, 0, dtype=torch.bool, device=self.device),
        )

    def forward_grounding(
        self, backbone_out: Mapping, find_input, geometric_prompt: Prompt, find_target=None
    ) -> dict:
        """sam3's Sam3Image.forward_grounding in eval mode, with its argument names.

        backbone_out: forward_image's dict updated with forward_text's; find_input: img_ids and
        text_ids (P,) of the P prompts (FindInput, or sam3's FindStage); geometric_prompt: their boxes
        and points (P prompts; `empty_prompt(P)` for text alone). find_target is unused (training).

        Returns sam3's eval keys, batch first: pred_logits (P, Q, 1), pred_boxes (P, Q, 4) cxcywh and
        pred_boxes_xyxy in [0, 1], presence_logit_dec (P, 1), pred_masks (P, Q, H, W) and
        semantic_seg (P, 1, H, W) logits at the finest level, queries (P, Q, C) the last decoder
        layer's states, presence_feats (1, P, C), encoder_hidden_states (HW, P, C); and presence_logit
        (None: the segmentation head has no presence head).
        """
        img_ids, text_ids = find_input.img_ids, find_input.text_ids
        levels = backbone_out["backbone_fpn"]
        coarsest, coarsest_pos = levels[-1][img_ids], backbone_out["vision_pos_enc"][-1][img_ids]
        feat_size = (coarsest.shape[-2], coarsest.shape[-1])
        # (P, C, H, W) -> (HW, P, C), sam3's sequence-first layout
        image, image_pos = coarsest.flatten(2).permute(2, 0, 1), coarsest_pos.flatten(2).permute(2, 0, 1)

        geo, geo_mask = self.geometry_encoder(geometric_prompt, [image], [feat_size], [image_pos])
        text = backbone_out["language_features"][:, text_ids]
        prompt = torch.cat([text, geo])
        prompt_mask = torch.cat([backbone_out["language_mask"][text_ids], geo_mask], dim=1)

        memory = self.transformer.encoder(image, image_pos, prompt, prompt_mask)
        decoder = self.transformer.decoder
        hs, start_boxes, presence_logits, presence_feats = decoder(memory, image_pos, prompt, prompt_mask, feat_size)
        last = hs[-1].transpose(0, 1)  # (P, Q, C)
        boxes = (inverse_sigmoid(start_boxes[-1].transpose(0, 1)) + decoder.bbox_embed(last)).sigmoid()
        out = {
            "encoder_hidden_states": memory,
            "presence_feats": presence_feats,
            "queries": last,
            "presence_logit_dec": presence_logits[-1].transpose(0, 1),
            "pred_logits": self.dot_prod_scoring(last[None], prompt, prompt_mask)[0],
            "pred_boxes": boxes,
            "pred_boxes_xyxy": box_cxcywh_to_xyxy(boxes),
        }
        out.update(
            self.segmentation_head(
                backbone_feats=levels,
                obj_queries=last[None],
                image_ids=img_ids,
                encoder_hidden_states=memory,
                prompt=prompt,
                prompt_mask=prompt_mask,
            )
        )
        return out


def detection_scores(outputs: Mapping) -> torch.Tensor:
    """(P, Q) probabilities of forward_grounding's outputs: each query's sigmoid(logit) times its
    prompt's presence probability, as sam3's Sam3Processor scores them."""
    presence = outputs["presence_logit_dec"].sigmoid().unsqueeze(1)  # (P, 1, 1)
    return (outputs["pred_logits"].sigmoid() * presence).squeeze(-1)
