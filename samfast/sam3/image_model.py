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
import torch.nn.functional as F
from torch import nn

from samfast.modeling.static_batch import in_static_batches
from samfast.sam3.boxes import box_cxcywh_to_xyxy, inverse_sigmoid
from samfast.sam3.detr_decoder import DetrDecoder
from samfast.sam3.fusion_encoder import FusionEncoder
from samfast.sam3.geometric_prompt import Prompt
from samfast.sam3.geometry_encoder import SequenceGeometryEncoder
from samfast.sam3.interactive import InteractivePredictor, predict_inst, predict_inst_batch
from samfast.sam3.neck import Sam3DualViTDetNeck
from samfast.sam3.scoring import DotProductScoring
from samfast.sam3.segmentation_head import UniversalSegmentationHead
from samfast.sam3.text import TextEncoder


class VisionLanguageBackbone(nn.Module):
    """sam3's SAM3VLBackbone: the vision backbone and the text encoder side by side, no fusion, with
    its output dicts. `scalp` coarsest neck levels are dropped (SAM 3 drops the 0.5x one)."""

    # with the compile switch: the vision backbone's one batch size (samfast.modeling.static_batch)
    static_batch: int | None = None

    def __init__(self, visual: Sam3DualViTDetNeck, text: TextEncoder, scalp: int = 1) -> None:
        super().__init__()
        self.vision_backbone = visual
        self.language_backbone = text
        self.scalp = scalp

    def forward_image(self, images: torch.Tensor) -> dict:
        """(B, 3, H, W) normalized images (float32; cast to the weights' dtype) -> backbone_fpn (the
        levels, finest first), vision_pos_enc (their sine encodings), vision_features (the coarsest kept
        level) and sam2_backbone_out (the second branch's, or None without it)."""
        images = images.to(self.vision_backbone.trunk.pos_embed.dtype)
        sam3_feats, sam3_pos, sam2_feats, sam2_pos = in_static_batches(self.vision_backbone, images, self.static_batch)
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
        # the point and box predictor (samfast.sam3.interactive), built with enable_inst_interactivity
        self.inst_interactive_predictor: InteractivePredictor | None = None

    # set by compile_prompt_path (the compile switch): prompts per call -> forward_grounding's graph
    compiled_grounding: dict | None = None

    def predict_inst(self, inference_state: dict, **kwargs) -> tuple:
        """sam3's predict_inst: point and box prompts (SAM2ImagePredictor.predict's arguments) on the
        image of Sam3Processor.set_image's state; (masks, IoU predictions, low-res logits) as numpy."""
        return predict_inst(self.inst_interactive_predictor, inference_state, **kwargs)

    def predict_inst_batch(self, inference_state: dict, *args, **kwargs) -> tuple:
        """sam3's predict_inst_batch: prompts per image of Sam3Processor.set_image_batch's state."""
        return predict_inst_batch(self.inst_interactive_predictor, inference_state, *args, **kwargs)

    @property
    def device(self) -> torch.device:
        return self.dot_prod_scoring.hs_proj.weight.device

    @property
    def static_batch(self) -> int | None:
        """With the compile switch, the vision backbone's one batch size (build_sam's batch_size)."""
        return self.backbone.static_batch

    @static_batch.setter
    def static_batch(self, size: int | None) -> None:
        self.backbone.static_batch = size

    # --- what the stage switches act on (samfast.stages.SwitchTarget): the ViT is the image encoder;
    # SAM 3 has no memory, no SAM-style prompt decoder and no part the triton switch's kernels take
    @property
    def image_encoder(self) -> Sam3DualViTDetNeck:
        """The ViT and its neck: compiled whole by the compile switch."""
        return self.backbone.vision_backbone

    def attention_modules(self) -> dict[str, nn.Module]:
        """Every attention with an `attn_impl` (the sdpa switch's): the ViT's, the text encoder's, the detector's."""
        return {name: m for name, m in self.named_modules() if hasattr(m, "attn_impl")}

    def encoder_blocks(self) -> dict[str, nn.Module]:
        return {f"backbone.vision_backbone.trunk.blocks.{i}": block for i, block in enumerate(self.image_encoder.trunk.blocks)}

    def encoder_linears(self) -> dict[str, nn.Linear]:
        """The linears inside the ViT's blocks (attention and MLP)."""
        return {f"{name}.{sub}": m for name, block in self.encoder_blocks().items()
                for sub, m in block.named_modules() if isinstance(m, nn.Linear)}

    def encoder_mlps(self) -> list[nn.Module]:
        """None: the ViT's MLP has one GELU path (the SAM 1 / 2 `gelu_impl` epilogue is not built for it)."""
        return []

    def patch_embedding(self) -> nn.Module:
        return self.image_encoder.trunk.patch_embed

    def prompt_decoder(self) -> None:
        return None

    def triton_attention_modules(self) -> dict[str, nn.Module]:
        return {}

    def memory_cross_attentions(self) -> dict[str, nn.Module]:
        return {}

    def mask_downsamplers(self) -> dict[str, nn.Module]:
        return {}

    def bias_channel_blocks(self) -> dict[str, nn.Module]:
        return {}

    def rewrite_encoder_for_compile(self) -> None:
        """The neck's sine encodings computed now, in the weights' dtype, so the compiled graph reads them
        as constants (PositionEmbeddingSine.fill_cache)."""
        neck, grid = self.image_encoder, self.image_encoder.trunk.img_size // self.image_encoder.trunk.patch_embed.proj.stride[0]
        for scale in neck.scale_factors:
            size = int(grid * scale)
            neck.position_encoding.fill_cache((size, size), self.device, neck.trunk.pos_embed.dtype)

    def compile_prompt_path(self) -> None:
        """The compile switch's graphs of what runs per phrase and per prompt, all on static shapes: the
        text encoder on batches of TEXT_BATCH phrases (fewer padded), and forward_grounding on one prompt
        or on batches of PROMPT_BATCH prompts (fewer padded), the exemplar boxes padded to BOX_SLOTS: one
        graph each for any number of images and phrases and 0 to 4 boxes. (Dynamic prompt counts were
        tried: choosing the convolutions' algorithm bounds them, a recompile past 15 prompts on the CPU.)"""
        self.backbone.language_backbone.compile_for_batches(TEXT_BATCH)
        self.compiled_grounding = {
            1: torch.compile(self._ground_one_prompt, dynamic=False, fullgraph=True),
            PROMPT_BATCH: torch.compile(self._ground_prompt_batch, dynamic=False, fullgraph=True),
        }

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
        args = (list(backbone_out["backbone_fpn"]), backbone_out["vision_pos_enc"][-1], backbone_out["language_features"],
                backbone_out["language_mask"], find_input.img_ids, find_input.text_ids, geometric_prompt)
        if self.compiled_grounding is None:
            return self._ground(*args)
        return self._ground_compiled(*args)

    def _ground_compiled(self, levels, coarsest_pos, text_features, text_mask, img_ids, text_ids, prompt: Prompt) -> dict:
        """The compiled graphs on chunks of one prompt or PROMPT_BATCH prompts (the last chunk padded with
        copies of the last prompt), each prompt's image, phrase and boxes gathered first, so a graph's
        shapes are its chunk's whatever the number of images and phrases; the outputs joined and cut back."""
        num_prompts = img_ids.shape[0]
        size = 1 if num_prompts == 1 else PROMPT_BATCH
        prompt = padded_boxes(prompt)
        chunks = []
        for start in range(0, num_prompts, size):
            # made on the device: an index copied from the host would make it wait
            picked = torch.arange(start, start + size, device=img_ids.device).clamp_(max=num_prompts - 1)
            images, phrases = img_ids[picked], text_ids[picked]
            out = self.compiled_grounding[size](
                [level[images] for level in levels], coarsest_pos[images], text_features[:, phrases], text_mask[phrases],
                prompt_subset(prompt, picked),
            )
            real = min(size, num_prompts - start)
            chunks.append({key: None if value is None else value.narrow(PROMPTS_NOT_FIRST.get(key, 0), 0, real)
                           for key, value in out.items()})
        if len(chunks) == 1:
            return chunks[0]
        return {key: None if value is None else torch.cat([c[key] for c in chunks], PROMPTS_NOT_FIRST.get(key, 0))
                for key, value in chunks[0].items()}

    def _ground_one_prompt(self, levels, coarsest_pos, text_features, text_mask, prompt: Prompt) -> dict:
        """_ground of one prompt on its own image and phrase: the compile switch's graph for one prompt."""
        return self._ground_each_own(levels, coarsest_pos, text_features, text_mask, prompt)

    def _ground_prompt_batch(self, levels, coarsest_pos, text_features, text_mask, prompt: Prompt) -> dict:
        """The same for PROMPT_BATCH prompts: its own function, so dynamo caches its graph apart from the
        one-prompt graph (a first compile, never a recompile of it)."""
        return self._ground_each_own(levels, coarsest_pos, text_features, text_mask, prompt)

    def _ground_each_own(self, levels, coarsest_pos, text_features, text_mask, prompt: Prompt) -> dict:
        """_ground where prompt i takes image i and phrase i (the inputs gathered per prompt)."""
        own = torch.arange(levels[0].shape[0], device=levels[0].device)
        return self._ground(levels, coarsest_pos, text_features, text_mask, own, own, prompt)

    def _ground(self, levels, coarsest_pos, text_features, text_mask, img_ids, text_ids, geometric_prompt: Prompt) -> dict:
        """forward_grounding on its tensors: the levels (n_images, C, H, W), the coarsest level's encoding,
        the phrases' features (L, T, C) and padding mask (T, L), each prompt's image and phrase, the geometry."""
        coarsest, coarsest_pos = levels[-1][img_ids], coarsest_pos[img_ids]
        feat_size = (coarsest.shape[-2], coarsest.shape[-1])
        # (P, C, H, W) -> (HW, P, C), sam3's sequence-first layout
        image, image_pos = coarsest.flatten(2).permute(2, 0, 1), coarsest_pos.flatten(2).permute(2, 0, 1)

        geo, geo_mask = self.geometry_encoder(geometric_prompt, [image], [feat_size], [image_pos])
        prompt = torch.cat([text_features[:, text_ids], geo])
        prompt_mask = torch.cat([text_mask[text_ids], geo_mask], dim=1)

        memory = self.transformer.encoder(image, image_pos, prompt, prompt_mask)
        decoder = self.transformer.decoder
        hs, start_boxes, presence_logits, presence_feats = decoder(memory, image_pos, prompt, prompt_mask, feat_size)
        last = hs[-1].transpose(0, 1)  # (P, Q, C)
        boxes = (inverse_sigmoid(start_boxes[-1].transpose(0, 1)) + decoder.bbox_embed(last).float()).sigmoid()
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


# under the compile switch: the text encoder's one phrase batch; forward_grounding's prompts per graph
# (one, or a batch of PROMPT_BATCH); the exemplar boxes' slots per graph
TEXT_BATCH = 8
PROMPT_BATCH = 8
BOX_SLOTS = 4
# forward_grounding's outputs whose prompts lie along another axis than the first
PROMPTS_NOT_FIRST = {"encoder_hidden_states": 1, "presence_feats": 1}


def padded_boxes(prompt: Prompt) -> Prompt:
    """`prompt` with its boxes padded to a multiple of BOX_SLOTS (at least one), each padding box masked:
    what every attention and mean leaves out, so the outputs are the same. Labels as long, whether they
    came as bool or long: a graph is made for one dtype."""
    boxes = prompt.box_embeddings.shape[0]
    pad = max(BOX_SLOTS, -(-boxes // BOX_SLOTS) * BOX_SLOTS) - boxes
    return Prompt(
        box_embeddings=F.pad(prompt.box_embeddings, (0, 0, 0, 0, 0, pad)),
        box_labels=F.pad(prompt.box_labels.long(), (0, 0, 0, pad), value=1),
        box_mask=F.pad(prompt.box_mask, (0, pad), value=True),
        point_embeddings=prompt.point_embeddings, point_labels=prompt.point_labels.long(), point_mask=prompt.point_mask,
    )


def prompt_subset(prompt: Prompt, picked: torch.Tensor) -> Prompt:
    """The prompts `picked` (indices, repeats allowed) of a Prompt."""
    return Prompt(
        box_embeddings=prompt.box_embeddings[:, picked], box_labels=prompt.box_labels[:, picked],
        box_mask=prompt.box_mask[picked], point_embeddings=prompt.point_embeddings[:, picked],
        point_labels=prompt.point_labels[:, picked], point_mask=prompt.point_mask[picked],
    )


def detection_scores(outputs: Mapping) -> torch.Tensor:
    """(P, Q) probabilities of forward_grounding's outputs: each query's sigmoid(logit) times its
    prompt's presence probability, as sam3's Sam3Processor scores them."""
    presence = outputs["presence_logit_dec"].float().sigmoid().unsqueeze(1)  # (P, 1, 1)
    return (outputs["pred_logits"].float().sigmoid() * presence).squeeze(-1)
