"""SAM2ImagePredictor with sam2's signatures: embed an image once, then decode prompts against it.

The same steps as sam2.sam2_image_predictor, so results equal it in fp32: a box becomes two
corner points (labels 2 and 3) in front of the point prompts; several boxes or point sets decode
as a batch against the one image; masks are upsampled to the image size and thresholded,
low-res logits clamped to [-32, 32]. Outputs are numpy arrays, as sam2 returns them.
The attribute names sam2's own automatic mask generator reads (_features, _orig_hw,
_transforms, _predict) are kept.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch import nn

from samfast.modeling.sam2_prompting.transforms import SAM2Transforms
from samfast.transfer import to_device


class SAM2ImagePredictor:
    def __init__(
        self, sam_model: nn.Module, mask_threshold: float = 0.0, max_hole_area: float = 0.0, max_sprinkle_area: float = 0.0,
        connected_components: bool = False, **kwargs
    ) -> None:
        """sam_model: what has SAM 2's prompt path (image_size, device, sam_prompt_encoder, sam_mask_decoder;
        image_features for set_image): samfast.sam2.SAM2Base, or SAM 3's interactive heads (features set
        from outside, as sam3's predict_inst sets them).
        max_hole_area / max_sprinkle_area > 0: see SAM2Transforms.postprocess_masks (filled with
        connected_components, as sam3's predictor does; else warned and skipped, as sam2 without its extension)."""
        self.model = sam_model
        self._transforms = SAM2Transforms(sam_model.image_size, mask_threshold, max_hole_area, max_sprinkle_area,
                                          connected_components)
        self.mask_threshold = mask_threshold
        self.reset_predictor()

    @property
    def device(self) -> torch.device:
        return self.model.device

    def reset_predictor(self) -> None:
        self._is_image_set = False
        self._features = None
        self._orig_hw = None
        self._is_batch = False

    @torch.no_grad()
    def set_image(self, image: np.ndarray | Image.Image) -> None:
        """Embed one HxWx3 RGB uint8 array or PIL image."""
        self.reset_predictor()
        if isinstance(image, np.ndarray):
            orig_hw = image.shape[:2]
        elif isinstance(image, Image.Image):
            orig_hw = (image.height, image.width)
        else:
            raise NotImplementedError(f"images must be numpy arrays or PIL images, not {type(image).__name__}")
        self.set_features(*self._image_features(self._transforms(image)[None]), [orig_hw])

    @torch.no_grad()
    def set_image_batch(self, image_list: list[np.ndarray]) -> None:
        """Embed several HxWx3 RGB uint8 arrays, for predict_batch."""
        self.reset_predictor()
        if not isinstance(image_list, list) or not all(isinstance(img, np.ndarray) for img in image_list):
            raise TypeError("set_image_batch takes a list of HxWx3 numpy arrays in RGB")
        self.set_features(*self._image_features(self._transforms.forward_batch(image_list)),
                          [img.shape[:2] for img in image_list], batch=True)

    def set_features(self, image_embed: torch.Tensor, high_res_feats: list[torch.Tensor],
                     orig_hw: list[tuple[int, int]], batch: bool = False) -> None:
        """The image state of set_image (set_image_batch with `batch`), from features: (B, C, H, W) embeddings,
        the two finer levels, each image's (height, width). set_image and set_image_batch end here, and SAM 3's
        predict_inst sets its image model's features so."""
        self.reset_predictor()
        self._features = {"image_embed": image_embed, "high_res_feats": list(high_res_feats)}
        self._orig_hw = list(orig_hw)
        self._is_image_set = True
        self._is_batch = batch

    def _image_features(self, img_batch: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.model.image_features(to_device(img_batch, torch.float, self.device))

    def get_image_embedding(self) -> torch.Tensor:
        """(B, 256, 64, 64) embedding of the set image(s)."""
        if not self._is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) to generate an embedding.")
        return self._features["image_embed"]

    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        mask_input: np.ndarray | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(masks (C, H, W) or (B, C, H, W), IoU predictions, low-res logits (C, 256, 256)) for the set image.

        point_coords (N, 2) or (B, N, 2) in pixels (in [0, 1] with normalize_coords=False),
        point_labels (N,) or (B, N) with 1 foreground, 0 background; box (4,) or (B, 4) x0 y0 x1 y1;
        mask_input (1, 256, 256) logits of a previous prediction.
        """
        if not self._is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")
        mask_input, coords, labels, boxes = self._prep_prompts(
            point_coords, point_labels, box, mask_input, normalize_coords
        )
        results = self._predict(coords, labels, boxes, mask_input, multimask_output, return_logits=return_logits)
        return tuple(_numpy(result) for result in results)

    def predict_batch(
        self,
        point_coords_batch: list[np.ndarray] | None = None,
        point_labels_batch: list[np.ndarray] | None = None,
        box_batch: list[np.ndarray] | None = None,
        mask_input_batch: list[np.ndarray] | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """predict for each image of set_image_batch, the i-th prompts of each list for the i-th image."""
        if not self._is_batch:
            raise RuntimeError("predict_batch needs images set with .set_image_batch(...)")
        outputs = [], [], []
        batches = point_coords_batch, point_labels_batch, box_batch, mask_input_batch
        for img_idx in range(len(self._features["image_embed"])):
            prompts = (None if batch is None else batch[img_idx] for batch in batches)
            mask_input, coords, labels, boxes = self._prep_prompts(*prompts, normalize_coords, img_idx=img_idx)
            results = self._predict(
                coords, labels, boxes, mask_input, multimask_output, return_logits=return_logits, img_idx=img_idx
            )
            for out, result in zip(outputs, results):
                out.append(_numpy(result))
        return outputs

    def _prep_prompts(self, point_coords, point_labels, box, mask_logits, normalize_coords, img_idx=-1):
        """(mask input, coords, labels, box corners) as tensors in the model's input frame."""
        unnorm_coords = labels = unnorm_box = mask_input = None
        orig_hw = self._orig_hw[img_idx]
        if point_coords is not None:
            if point_labels is None:
                raise ValueError("point_labels must be supplied if point_coords is supplied.")
            coords = to_device(point_coords, torch.float, self.device)
            unnorm_coords = self._transforms.transform_coords(coords, normalize=normalize_coords, orig_hw=orig_hw)
            labels = to_device(point_labels, torch.int, self.device)
            if unnorm_coords.ndim == 2:
                unnorm_coords, labels = unnorm_coords[None], labels[None]
        if box is not None:
            box = to_device(box, torch.float, self.device)
            unnorm_box = self._transforms.transform_boxes(box, normalize=normalize_coords, orig_hw=orig_hw)
        if mask_logits is not None:
            mask_input = to_device(mask_logits, torch.float, self.device)
            if mask_input.ndim == 3:
                mask_input = mask_input[None]
        return mask_input, unnorm_coords, labels, unnorm_box

    @torch.no_grad()
    def _predict(
        self,
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        boxes: torch.Tensor | None = None,
        mask_input: torch.Tensor | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        img_idx: int = -1,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Masks (B, C, H, W), IoUs (B, C), low-res logits (B, C, 256, 256) of prompts already in the input frame."""
        image_embed = self._features["image_embed"][img_idx].unsqueeze(0)
        high_res_features = [level[img_idx].unsqueeze(0) for level in self._features["high_res_feats"]]
        low_res_masks, iou_predictions = self._decode(
            point_coords, point_labels, boxes, mask_input, multimask_output, image_embed, high_res_features
        )
        return self._finish(low_res_masks, iou_predictions, self._orig_hw[img_idx], return_logits)

    def _finish(self, low_res_masks: torch.Tensor, iou_predictions: torch.Tensor, orig_hw: tuple[int, int],
                return_logits: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decoder outputs -> (masks at the image size, IoUs, low-res logits clamped as sam2 does)."""
        masks = self._transforms.postprocess_masks(low_res_masks, orig_hw)
        low_res_masks = torch.clamp(low_res_masks, -32.0, 32.0)
        if not return_logits:
            masks = masks > self.mask_threshold
        return masks, iou_predictions, low_res_masks

    def _decode(
        self,
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        boxes: torch.Tensor | None,
        mask_input: torch.Tensor | None,
        multimask_output: bool,
        image_embed: torch.Tensor,
        high_res_features: list[torch.Tensor],
        image_index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Unclamped low-res logits (B, C, 256, 256) and IoUs (B, C) against one image's features
        ((1, 256, 64, 64) and its two high-resolution levels): _predict before the upsampling,
        which the automatic mask generator does only for the masks that pass its filters. With
        image_index (B,), prompt b reads image image_index[b] of the features (the nt switch)."""
        points = None if point_coords is None else (point_coords, point_labels)
        if boxes is not None:
            # a box is its two corners, labelled 2 and 3, in front of the points
            box_coords = boxes.reshape(-1, 2, 2)
            box_labels = torch.arange(2, 4, dtype=torch.int, device=boxes.device).repeat(boxes.shape[0], 1)  # corner labels 2, 3
            if points is None:
                points = (box_coords, box_labels)
            else:
                points = (torch.cat([box_coords, points[0]], dim=1), torch.cat([box_labels, points[1]], dim=1))

        prompt_encoder = self.model.sam_prompt_encoder
        sparse, dense = prompt_encoder(points=points, boxes=None, masks=mask_input)
        several_prompts = points is not None and points[0].shape[0] > 1
        low_res_masks, iou_predictions, _, _ = self.model.sam_mask_decoder(
            image_embeddings=image_embed,
            image_pe=prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=multimask_output,
            repeat_image=several_prompts,
            high_res_features=high_res_features,
            image_index=image_index,
        )
        return low_res_masks, iou_predictions


def _numpy(x: torch.Tensor) -> np.ndarray:
    """sam2's output convention: a leading batch of one dropped, float32 on the host (masks as 0.0 / 1.0)."""
    return x.squeeze(0).float().detach().cpu().numpy()
