"""SamPredictor's API for a SAM 2 model: what samfast.SamPredictor(sam2_model) builds.

set_image and predict take the keyword arguments segment_anything's and sam2's predictors share
(point_coords, point_labels, box, mask_input, multimask_output, return_logits) and give
SAM2ImagePredictor's masks, scores and low-res logits, masks as bool as SamPredictor returns them.
SAM 1's predict_batch(images, prompts) serves SAM 2 too (the parity gate's point task runs through
it); sam2's own batched calls are SAM2ImagePredictor's set_image_batch / predict_batch.
"""

from __future__ import annotations

import numpy as np
import torch

from samfast.predictor import Prediction, Prompts, SamPredictor, check_one_prompt_kind
from samfast.modeling.sam2_prompting.image_predictor import SAM2ImagePredictor
from samfast.sam2.sam2_base import SAM2Base
from samfast.transfer import to_device
from samfast.transforms import InputError, to_rgb_uint8


class SamPredictorForSAM2(SamPredictor, serves=SAM2Base):
    def __init__(self, sam_model: SAM2Base) -> None:
        self.model = sam_model
        self.image_predictor = SAM2ImagePredictor(sam_model)  # sam2's steps, so its outputs
        self.reset_image()

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Embed an HxWxC uint8 image (grayscale and RGBA are converted) for later predict calls."""
        if image_format not in ("RGB", "BGR"):
            raise InputError(f"image_format must be 'RGB' or 'BGR', got {image_format!r}")
        image = to_rgb_uint8(image)
        if image_format == "BGR":
            image = image[..., ::-1]
        self.reset_image()
        self.image_predictor.set_image(np.ascontiguousarray(image))
        self.original_size = image.shape[:2]
        self.is_image_set = True

    def set_torch_image(self, transformed_image: torch.Tensor, original_image_size: tuple[int, ...]) -> None:
        raise InputError("set_torch_image takes SAM 1's resized frame; SAM 2 stretches images to 1024 x 1024: use set_image")

    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        mask_input: np.ndarray | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks (C, H, W), IoU predictions (C,) and low-res logits (C, 256, 256) for one prompt."""
        self._require_image()
        masks, iou, low_res = self.image_predictor.predict(
            point_coords, point_labels, box, mask_input, multimask_output, return_logits
        )
        return (masks if return_logits else masks.astype(bool)), iou, low_res

    def predict_torch(
        self,
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        boxes: torch.Tensor | None = None,
        mask_input: torch.Tensor | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prompts already in SAM 2's 1024 x 1024 input frame, as torch tensors (BxNx2, BxN, Bx4, Bx1x256x256)."""
        self._require_image()
        return self.image_predictor._predict(point_coords, point_labels, boxes, mask_input, multimask_output, return_logits)

    def get_image_embedding(self) -> torch.Tensor:
        self._require_image()
        return self.image_predictor.get_image_embedding()

    def reset_image(self) -> None:
        super().reset_image()
        self.image_predictor.reset_predictor()

    @torch.no_grad()
    def predict_batch(self, images: list[np.ndarray], prompts: list[Prompts], multimask_output: bool = True
                      ) -> list[Prediction]:
        """SAM 1's predict_batch for a SAM 2 model: the images through the encoder in one batch, then
        each image's prompts in one decoder call, or with the nt switch the prompts of every image in
        one call (each prompt reading its image's features through image_index); the same checks,
        Prompts and Predictions. The image set with set_image stays set."""
        rgb, sizes, torch_prompts, results, active = self._checked_batch(images, prompts, multimask_output)
        if not active:
            return results
        predictor = self.image_predictor
        batch = predictor._transforms.forward_batch([np.ascontiguousarray(rgb[i]) for i in active])
        image_embed, high_res = self.model.image_features(to_device(batch, torch.float, self.device))
        active_prompts = [torch_prompts[i] for i in active]
        if "nt" in self.model.switches:
            decoded = self._decode_all_images(image_embed, high_res, active_prompts, multimask_output)
        else:
            decoded = [predictor._decode(*tp, None, multimask_output, image_embed[j : j + 1],
                                         [level[j : j + 1] for level in high_res]) for j, tp in enumerate(active_prompts)]
        for i, (low_res, iou) in zip(active, decoded):
            results[i] = Prediction(*predictor._finish(low_res, iou, sizes[i], return_logits=False))
        return results

    def _decode_all_images(self, image_embed, high_res, active_prompts, multimask_output):
        """The nt switch: the prompts of every image (one kind, as SAM 1's nt asks) in one decoder call,
        split back per image by the host-side counts (no sync)."""
        check_one_prompt_kind(active_prompts)
        counts = [len(tp[0] if tp[0] is not None else tp[2]) for tp in active_prompts]
        coords, labels, boxes = (None if active_prompts[0][k] is None else torch.cat([tp[k] for tp in active_prompts])
                                 for k in range(3))
        image_index = torch.repeat_interleave(torch.arange(len(counts), device=self.device),
                                              to_device(np.array(counts), torch.int64, self.device), output_size=sum(counts))
        low_res, iou = self.image_predictor._decode(coords, labels, boxes, None, multimask_output, image_embed, high_res,
                                                    image_index)
        return list(zip(low_res.split(counts), iou.split(counts)))

    def _to_model_frame(self, coords: np.ndarray, original_size) -> np.ndarray:
        """SAM 2's frame: the image stretched to 1024 x 1024, in float32 as sam2's predictor computes it
        (so predict and predict_batch give a prompt the same coordinates)."""
        frame = self.image_predictor._transforms.transform_coords(
            torch.as_tensor(coords, dtype=torch.float), normalize=True, orig_hw=original_size)
        return frame.numpy()

    def _prompt_encoder(self):
        return self.model.sam_prompt_encoder
