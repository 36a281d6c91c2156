"""SAM 3's user API (sam3.model.sam3_image_processor.Sam3Processor): set an image, ask for a concept by
a phrase and/or example boxes, get every instance's mask, box and score in the image's pixels.

The same methods, arguments and state keys as sam3's. The image is resized to resolution x resolution
without keeping its aspect ratio, through uint8 as sam3 does (the same pixels as sam3's on a CPU: see transform), scaled to
[0, 1] and normalized with mean = std = 0.5. The model's outputs at 1 / 4 of the resolution are
resized to the image's size (bilinear), and the instances scoring above the confidence threshold
(sigmoid(logit) * presence probability) are kept: that selection has a data-dependent size, so it
is where the processor waits for the device (once per prompt); the model's forward does not.

Beyond sam3's API: `predict_batch(images, phrases)` runs every phrase on every image with one call of
each part of the model, and phrases are encoded once per weights (samfast.sam3.text_cache), whatever
the number of images they are asked of.
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
from samfast.sam3.text_cache import PhraseEncodings
from samfast.transfer import to_device

# the phrase sam3 prompts with when only boxes are given: the model was trained to read it as "no text"
VISUAL_ONLY_PHRASE = "visual"


class Sam3Processor:
    def __init__(
        self,
        model: Sam3ImageModel,
        resolution: int = IMAGE_SIZE,
        device: torch.device | str | None = None,
        confidence_threshold: float = 0.5,
        text_cache_size: int = 256,
    ) -> None:
        """text_cache_size: how many phrases' encodings to keep (0: encode every phrase every time)."""
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
        self.phrase_encodings = PhraseEncodings(model.backbone, max_phrases=text_cache_size)
        # one prompt: image 0, phrase 0
        self.find_stage = FindInput(
            img_ids=torch.zeros(1, dtype=torch.long, device=self.device),
            text_ids=torch.zeros(1, dtype=torch.long, device=self.device),
        )
        # on the device once: torchvision's normalize copies python lists to it on every image, from pageable
        # memory, which makes the host wait for the GPU
        self.pixel_mean = to_device(PIXEL_MEAN, torch.float32, self.device).view(-1, 1, 1)
        self.pixel_std = to_device(PIXEL_STD, torch.float32, self.device).view(-1, 1, 1)

    def transform(self, image: PIL.Image.Image | torch.Tensor | np.ndarray) -> torch.Tensor:
        """An image (PIL, (C, H, W) tensor or (H, W, C) array) -> (3, resolution, resolution) float32.

        Resized where it is: a host image on the host, then its uint8 pixels to the device. A uint8 resize
        rounds differently on CUDA (in float, then rounded) than on a CPU (fixed point), by one level here
        and there, and on the embedded concept check that moved a presence probability by 1.1e-3 from the
        CPU-made golden, past fp32's limit; resized on the host, an image's pixels are the same whatever
        the model's device. sam3 resizes on the model's device: a GPU tensor is resized there, as in sam3."""
        image = v2.functional.to_dtype(v2.functional.to_image(image), torch.uint8, scale=True)
        image = v2.functional.resize(image, [self.resolution, self.resolution])
        # a host image through pinned memory: a pageable copy to a GPU makes the host wait for it
        image = to_device(image, image.dtype, self.device) if image.device.type == "cpu" else image.to(self.device)
        image = v2.functional.to_dtype(image, torch.float32, scale=True)
        return (image - self.pixel_mean) / self.pixel_std

    @torch.inference_mode()
    def set_image(self, image: PIL.Image.Image | torch.Tensor | np.ndarray, state: dict | None = None) -> dict:
        """Encode one image: state gets backbone_out, original_height and original_width (of an
        (H, W, C) array, H and W: sam3 reads an array's last two sizes, W and C, as its height and width)."""
        _check_image(image, "image")
        state = {} if state is None else state
        pixels = self.transform(image)
        state["original_height"], state["original_width"] = _size_of(image)
        state["backbone_out"] = self._encode(pixels[None])
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
        state["backbone_out"] = self._encode(torch.stack([self.transform(im) for im in images]))
        return state

    def _encode(self, pixels: torch.Tensor) -> dict:
        """The backbone's outputs; with the point and box predictor, its features prepared for it (the
        decoder's conv_s0 / conv_s1 on the SAM 2-style levels), as sam3's set_image does."""
        backbone_out = self.model.backbone.forward_image(pixels)
        if self.model.inst_interactive_predictor is not None and backbone_out.get("sam2_backbone_out") is not None:
            self.model.inst_interactive_predictor.prepare_features(backbone_out["sam2_backbone_out"])
        return backbone_out

    @torch.inference_mode()
    def set_text_prompt(self, prompt: str, state: dict) -> dict:
        """Find every instance of the phrase `prompt` (it replaces an earlier phrase; boxes added stay)."""
        _require_image(state)
        state["backbone_out"].update(self.phrase_encodings.encode([prompt], device=self.device))
        if "geometric_prompt" not in state:
            state["geometric_prompt"] = self.model.empty_prompt()
        return self._forward_grounding(state)

    @torch.inference_mode()
    def add_geometric_prompt(self, box: list[float], label: bool, state: dict) -> dict:
        """Add an example box, [centre x, centre y, width, height] normalized to [0, 1], positive (True)
        or negative (False), and find the instances again. Without a phrase, the phrase is "visual"."""
        _require_image(state)
        if "language_features" not in state["backbone_out"]:
            state["backbone_out"].update(self.phrase_encodings.encode([VISUAL_ONLY_PHRASE], device=self.device))
        if "geometric_prompt" not in state:
            state["geometric_prompt"] = self.model.empty_prompt()
        boxes = to_device(box, torch.float32, self.device).view(1, 1, 4)
        labels = to_device([label], torch.bool, self.device).view(1, 1)
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
    def predict_batch(
        self, images: list[PIL.Image.Image | torch.Tensor | np.ndarray], phrases: list[str]
    ) -> list[list[dict]]:
        """Every phrase on every image: results[i][j] holds what set_text_prompt(phrases[j], state) puts
        in the state of set_image(images[i]): masks, masks_logits, boxes and scores at the confidence
        threshold, original_height and original_width, and beyond sam3's keys each kept instance's
        decoder query (query_indices: a detection's identity, the same query of every stage answers
        the same question), every query's score, kept or not (query_scores), and the pair's presence
        probability (presence_score). Phrases may repeat.

        The images go through the ViT in one call, the distinct phrases not cached through the text
        encoder in one call, and all len(images) * len(phrases) pairs through the detector in one
        forward_grounding call (prompt i * len(phrases) + j takes image i and phrase j by index); none of
        that waits for the device. Then each pair keeps its instances above the threshold, a
        data-dependent count read back once per pair: a call makes len(images) * len(phrases) host
        syncs, all after the model has run.
        """
        if not isinstance(images, list) or not images:
            raise ValueError("images must be a non-empty list of images (PIL, (C, H, W) tensors or (H, W, C) arrays)")
        if not isinstance(phrases, list) or not phrases or not all(isinstance(p, str) for p in phrases):
            raise ValueError("phrases must be a non-empty list of strings: pass [phrase] for a single one")
        for i, image in enumerate(images):
            _check_image(image, f"images[{i}]")
        backbone_out = self.model.backbone.forward_image(torch.stack([self.transform(image) for image in images]))
        backbone_out.update(self.phrase_encodings.encode(phrases, device=self.device))
        n_images, n_phrases = len(images), len(phrases)
        find_input = FindInput(
            img_ids=to_device(np.repeat(np.arange(n_images), n_phrases), torch.long, self.device),
            text_ids=to_device(np.tile(np.arange(n_phrases), n_images), torch.long, self.device),
        )
        prompt = self.model.empty_prompt(n_images * n_phrases)
        outputs = self.model.forward_grounding(backbone_out=backbone_out, find_input=find_input, geometric_prompt=prompt)
        scores = detection_scores(outputs)
        presence = outputs["presence_logit_dec"].float().sigmoid().squeeze(-1)
        results = []
        for i, image in enumerate(images):
            height, width = _size_of(image)
            pairs = range(i * n_phrases, (i + 1) * n_phrases)
            results.append([
                {
                    "original_height": height,
                    "original_width": width,
                    "presence_score": presence[p],
                    "query_scores": scores[p],
                    **self._instances(outputs["pred_masks"][p], outputs["pred_boxes"][p], scores[p], height, width,
                                      with_queries=True),
                }
                for p in pairs
            ])
        return results

    @torch.inference_mode()
    def _forward_grounding(self, state: dict) -> dict:
        outputs = self.model.forward_grounding(
            backbone_out=state["backbone_out"], find_input=self.find_stage, geometric_prompt=state["geometric_prompt"]
        )
        scores = detection_scores(outputs)
        height, width = state["original_height"], state["original_width"]
        state.update(self._instances(outputs["pred_masks"][0], outputs["pred_boxes"][0], scores[0], height, width))
        return state

    def _instances(
        self, mask_logits: torch.Tensor, boxes: torch.Tensor, scores: torch.Tensor, height: int, width: int,
        with_queries: bool = False,
    ) -> dict:
        """One prompt's (Q, h, w) mask logits, (Q, 4) cxcywh boxes and (Q,) scores -> its instances above
        the confidence threshold in the image's pixels. One host sync: the number kept.
        with_queries: also each instance's decoder query (query_indices), beyond sam3's keys."""
        kept = (scores > self.confidence_threshold).nonzero().squeeze(1)
        # through pinned memory: a pageable copy to a GPU would be a second wait
        scale = to_device([width, height, width, height], torch.float32, self.device)
        # float32 from here, whatever the model's dtype: the outputs' dtypes are sam3's
        masks = F.interpolate(mask_logits[kept].float().unsqueeze(1), (height, width), mode="bilinear", align_corners=False)
        # sam3's name for these, though they are probabilities
        probabilities = masks.sigmoid()
        return {
            "masks_logits": probabilities,
            "masks": probabilities > 0.5,
            "boxes": box_cxcywh_to_xyxy(boxes[kept]) * scale,
            "scores": scores[kept],
            **({"query_indices": kept} if with_queries else {}),
        }


def _check_image(image, name: str) -> None:
    if not isinstance(image, (PIL.Image.Image, torch.Tensor, np.ndarray)):
        raise ValueError(
            f"{name} is a {type(image).__name__}: pass a PIL image, a (C, H, W) tensor or an (H, W, C) array"
        )


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
