"""SAM 3's user API (sam3.model.sam3_image_processor.Sam3Processor): set an image, ask for a concept by
a phrase and/or example boxes, get every instance's mask, box and score in the image's pixels.

The same methods, arguments and state keys as sam3's. The image is resized to resolution x resolution
without keeping its aspect ratio, through uint8 as sam3 does (so the pixels equal its), scaled to
[0, 1] and normalized with mean = std = 0.5. The model's outputs at 1 / 4 of the resolution are
resized to the image's size (bilinear), and the instances scoring above the confidence threshold
(sigmoid(logit) * presence probability) are kept: that selection has a data-dependent size, so it
is where the processor waits for the device; the model's forward does not.
"""

from __future__ import annotations

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from samfast.sam3.boxes import box_cxcywh_to_xyxy
from samfast.sam3.config import IMAGE_SIZE, PIXEL_MEAN, PIXEL_STD
from samfast.sam3.image_model import FindInput, Sam3ImageModel, detection_scores

# the phrase sam3 prompts with when only boxes are given: the model was trained to read it as "no text"
VISUAL_ONLY_PHRASE = "visual"


class Sam3Processor:
    def __init__(
        self,
        model: Sam3ImageModel,
        resolution: int = IMAGE_SIZE,
        device: torch.device | str | None = None,
        confidence_threshold: float = 0.5,
    ) -> None:
        trained_at = model.backbone.vision_backbone.trunk.img_size
        if resolution != trained_at:
            raise ValueError(
                f"resolution={resolution}, but the model's ViT takes {trained_at} x {trained_at} images "
                f"(its position tables are of that grid): pass resolution={trained_at}"
            )
        self.model = model
        self.resolution = resolution
        self.device = torch.device(device) if device is not None else model.device
        self.confidence_threshold = confidence_threshold
        # one prompt: image 0, phrase 0
        self.find_stage = FindInput(
            img_ids=torch.zeros(1, dtype=torch.long, device=self.device),
            text_ids=torch.zeros(1, dtype=torch.long, device=self.device),
        )

    def transform(self, image: PIL.Image.Image | torch.Tensor | np.ndarray) -> torch.Tensor:
        """An image (PIL, (C, H, W) tensor or (H, W, C) array) -> (3, resolution, resolution) float32."""
        image = v2.functional.to_image(image).to(self.device)
        image = v2.functional.to_dtype(image, torch.uint8, scale=True)
        image = v2.functional.resize(image, [self.resolution, self.resolution])
        image = v2.functional.to_dtype(image, torch.float32, scale=True)
        return v2.functional.normalize(image, mean=list(PIXEL_MEAN), std=list(PIXEL_STD))

    @torch.inference_mode()
    def set_image(self, image: PIL.Image.Image | torch.Tensor | np.ndarray, state: dict | None = None) -> dict:
        """Encode one image: state gets backbone_out, original_height and original_width (of an
        (H, W, C) array, H and W: sam3 reads an array's last two sizes, W and C, as its height and width)."""
        if not isinstance(image, (PIL.Image.Image, torch.Tensor, np.ndarray)):
            raise ValueError(
                f"image is a {type(image).__name__}: pass a PIL image, a (C, H, W) tensor or an (H, W, C) array"
            )
        state = {} if state is None else state
        pixels = self.transform(image)
        state["original_height"], state["original_width"] = _size_of(image)
        state["backbone_out"] = self.model.backbone.forward_image(pixels[None])
        return state

    @torch.inference_mode()
    def set_image_batch(self, images: list[PIL.Image.Image], state: dict | None = None) -> dict:
        """Encode a batch of PIL images: state gets backbone_out, original_heights and original_widths
        (sam3's batch state, which its instance predictor reads; the prompt methods use set_image's)."""
        if not isinstance(images, list) or not images:
            raise ValueError("images must be a non-empty list of PIL images")
        if not all(isinstance(image, PIL.Image.Image) for image in images):
            raise ValueError("images must all be PIL images: convert the others with PIL.Image.fromarray")
        state = {} if state is None else state
        state["original_heights"] = [image.height for image in images]
        state["original_widths"] = [image.width for image in images]
        state["backbone_out"] = self.model.backbone.forward_image(torch.stack([self.transform(im) for im in images]))
        return state

    @torch.inference_mode()
    def set_text_prompt(self, prompt: str, state: dict) -> dict:
        """Find every instance of the phrase `prompt` (it replaces an earlier phrase; boxes added stay)."""
        _require_image(state)
        state["backbone_out"].update(self.model.backbone.forward_text([prompt], device=self.device))
        if "geometric_prompt" not in state:
            state["geometric_prompt"] = self.model.empty_prompt()
        return self._forward_grounding(state)

    @torch.inference_mode()
    def add_geometric_prompt(self, box: list[float], label: bool, state: dict) -> dict:
        """Add an example box, [centre x, centre y, width, height] normalized to [0, 1], positive (True)
        or negative (False), and find the instances again. Without a phrase, the phrase is "visual"."""
        _require_image(state)
        if "language_features" not in state["backbone_out"]:
            state["backbone_out"].update(self.model.backbone.forward_text([VISUAL_ONLY_PHRASE], device=self.device))
        if "geometric_prompt" not in state:
            state["geometric_prompt"] = self.model.empty_prompt()
        boxes = torch.tensor(box, dtype=torch.float32, device=self.device).view(1, 1, 4)
        labels = torch.tensor([label], dtype=torch.bool, device=self.device).view(1, 1)
        state["geometric_prompt"].append_boxes(boxes, labels)
        return self._forward_grounding(state)

    def reset_all_prompts(self, state: dict) -> None:
        """Forget the phrase, the boxes and the results; keep the image."""
        for key in ("language_features", "language_mask", "language_embeds"):
            state.get("backbone_out", {}).pop(key, None)
        for key in ("geometric_prompt", "boxes", "masks", "masks_logits", "scores"):
            state.pop(key, None)

    @torch.inference_mode()
    def set_confidence_threshold(self, threshold: float, state: dict | None = None) -> dict | None:
        """Keep instances scoring above `threshold` from now on; re-run the prompt in `state` if it has results."""
        self.confidence_threshold = threshold
        if state is not None and "boxes" in state:
            return self._forward_grounding(state)
        return state

    @torch.inference_mode()
    def _forward_grounding(self, state: dict) -> dict:
        outputs = self.model.forward_grounding(
            backbone_out=state["backbone_out"], find_input=self.find_stage, geometric_prompt=state["geometric_prompt"]
        )
        scores = detection_scores(outputs)
        keep = scores > self.confidence_threshold
        height, width = state["original_height"], state["original_width"]
        scale = torch.tensor([width, height, width, height], dtype=torch.float32, device=self.device)
        masks = outputs["pred_masks"][keep].unsqueeze(1)
        masks = F.interpolate(masks, (height, width), mode="bilinear", align_corners=False)
        # sam3's name for these, though they are probabilities
        state["masks_logits"] = masks.sigmoid()
        state["masks"] = state["masks_logits"] > 0.5
        state["boxes"] = box_cxcywh_to_xyxy(outputs["pred_boxes"][keep]) * scale
        state["scores"] = scores[keep]
        return state


def _size_of(image: PIL.Image.Image | torch.Tensor | np.ndarray) -> tuple[int, int]:
    """(height, width) of a PIL image, a (..., H, W) tensor or an (H, W[, C]) array."""
    if isinstance(image, PIL.Image.Image):
        return image.height, image.width
    if isinstance(image, np.ndarray):
        return image.shape[0], image.shape[1]
    return image.shape[-2], image.shape[-1]


def _require_image(state: dict) -> None:
    if "backbone_out" not in state:
        raise ValueError("no image in this state: call set_image(image, state) before prompting")
