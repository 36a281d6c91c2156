"""SAM 3's point and box prompts (sam3's `predict_inst`): SAM 2's prompt path on SAM 3's image features.

With enable_inst_interactivity sam3 builds its whole video tracker and wraps it in
SAM3InteractiveImagePredictor (model/sam1_task_predictor.py, a near copy of sam2's SAM2ImagePredictor);
`predict_inst` uses three of the tracker's parts: its prompt encoder, its mask decoder (SAM 2's, with
SAM 1's MLP keys in the two-way transformer) and `no_mem_embed`, on the neck's second branch (the SAM
2-style features, whose two finest levels Sam3Processor.set_image passes through the decoder's conv_s0 and
conv_s1). samfast builds those three parts (InteractiveHeads) and answers with the shared
SAM2ImagePredictor, whose steps are sam2's and so sam3's. The tracker's other parts are video's:
sam3.pt's keys for them are left out when it is read for images (samfast.sam3.checkpoint).

Hole filling: sam3's predictor fills holes of up to 256 pixels in the low-resolution masks with its
connected components (cc_torch or its Triton kernel on a GPU, scikit-image on a CPU); samfast fills them
on any device with samfast.modeling.connected_components (SAM2Transforms.postprocess_masks).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from samfast.modeling.sam2_prompting.image_predictor import SAM2ImagePredictor
from samfast.modeling.sam2_prompting.mask_decoder import Sam2MaskDecoder
from samfast.modeling.sam2_prompting.prompt_encoder import Sam2PromptEncoder
from samfast.modeling.sam2_prompting.transformer import Sam2TwoWayTransformer

# sam3.model.sam1_task_predictor.SAM3InteractiveImagePredictor's default
MAX_HOLE_AREA = 256.0
# the feature levels the predictor reads: the last three of the neck's second branch (sam3's tracker's
# num_feature_levels), the coarsest as the image embedding
FEATURE_LEVELS = 3


class InteractiveHeads(nn.Module):
    """The tracker's parts `predict_inst` uses, under the tracker's key names (sam3.pt's `tracker.` keys):
    sam3's Sam3TrackerBase._build_sam_heads at width d_model (256 in SAM 3), and no_mem_embed."""

    def __init__(self, d_model: int, image_size: int, backbone_stride: int) -> None:
        super().__init__()
        self.image_size = image_size
        grid = image_size // backbone_stride
        self.sam_prompt_encoder = Sam2PromptEncoder(
            embed_dim=d_model, image_embedding_size=(grid, grid), input_image_size=(image_size, image_size),
            mask_in_chans=16,
        )
        transformer = Sam2TwoWayTransformer(depth=2, embedding_dim=d_model, num_heads=8, mlp_dim=8 * d_model,
                                            sam1_mlp_keys=True)
        self.sam_mask_decoder = Sam2MaskDecoder(transformer_dim=d_model, transformer=transformer,
                                                iou_head_hidden_dim=d_model)
        self.no_mem_embed = nn.Parameter(torch.zeros(1, 1, d_model))

    @property
    def device(self) -> torch.device:
        return self.no_mem_embed.device


class InteractivePredictor(nn.Module):
    """sam3's SAM3InteractiveImagePredictor: `model` holds the heads (so the keys are sam3's,
    `inst_interactive_predictor.model.*`); predicting is the shared SAM2ImagePredictor's."""

    def __init__(self, heads: InteractiveHeads, max_hole_area: float = MAX_HOLE_AREA) -> None:
        super().__init__()
        self.model = heads
        self.max_hole_area = max_hole_area

    def prepare_features(self, sam2_backbone_out: dict) -> None:
        """Apply the decoder's conv_s0 / conv_s1 to the two finest levels, in place: what sam3's
        Sam3Processor.set_image does to its state when the predictor exists."""
        levels = sam2_backbone_out["backbone_fpn"]
        decoder = self.model.sam_mask_decoder
        levels[0], levels[1] = decoder.conv_s0(levels[0]), decoder.conv_s1(levels[1])

    def predictor(self, sam2_backbone_out: dict, sizes: list[tuple[int, int]], batch: bool = False) -> SAM2ImagePredictor:
        """A SAM2ImagePredictor set to these features (after prepare_features) of images of `sizes`
        ((height, width) each), as sam3's predict_inst sets its: the coarsest level plus no_mem_embed is
        the image embedding, the two finer ones the high-resolution features."""
        levels = sam2_backbone_out["backbone_fpn"][-FEATURE_LEVELS:]
        predictor = SAM2ImagePredictor(self.model, max_hole_area=self.max_hole_area, connected_components=True)
        predictor.set_features(levels[-1] + self.model.no_mem_embed.view(1, -1, 1, 1), levels[:-1], sizes, batch)
        return predictor


def predict_inst(interactive: InteractivePredictor | None, state: dict, **kwargs) -> tuple[np.ndarray, ...]:
    """sam3's Sam3Image.predict_inst: point and box prompts on the image of Sam3Processor.set_image's
    `state` (SAM2ImagePredictor.predict's arguments and outputs)."""
    _require_interactive(interactive)
    size = (state["original_height"], state["original_width"])
    return interactive.predictor(state["backbone_out"]["sam2_backbone_out"], [size]).predict(**kwargs)


def predict_inst_batch(interactive: InteractivePredictor | None, state: dict, *args, **kwargs) -> tuple[list, ...]:
    """sam3's Sam3Image.predict_inst_batch: prompts per image of Sam3Processor.set_image_batch's `state`
    (SAM2ImagePredictor.predict_batch's arguments and outputs)."""
    _require_interactive(interactive)
    sizes = list(zip(state["original_heights"], state["original_widths"], strict=True))
    return interactive.predictor(state["backbone_out"]["sam2_backbone_out"], sizes, batch=True).predict_batch(*args, **kwargs)


def _require_interactive(interactive: InteractivePredictor | None) -> None:
    if interactive is None:
        raise RuntimeError(
            "predict_inst needs the model built with enable_inst_interactivity=True "
            "(build_sam3_image_model(..., enable_inst_interactivity=True), or "
            "samfast.build_sam('sam3', ..., enable_inst_interactivity=True))"
        )
