"""SamPredictor: the reference's API (set_image, predict, predict_torch) plus batched prediction over many images."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from samfast.transforms import check_inside, resize_longest_side, scale_coords, to_rgb_uint8


@dataclass
class Prompts:
    """Prompts for one image in original-image pixels: N prompts of k points each, and/or N boxes."""

    point_coords: np.ndarray | None = None  # (N, k, 2) as (x, y)
    point_labels: np.ndarray | None = None  # (N, k): 1 foreground, 0 background
    boxes: np.ndarray | None = None  # (N, 4) as x0, y0, x1, y1

    def __len__(self) -> int:
        return len(self.point_coords if self.point_coords is not None else self.boxes)


@dataclass
class Prediction:
    masks: torch.Tensor  # (N, C, H, W) bool (or logits with return_logits), original image size
    iou_predictions: torch.Tensor  # (N, C)
    low_res_logits: torch.Tensor  # (N, C, 256, 256)


class SamPredictor:
    def __init__(self, sam_model) -> None:
        self.model = sam_model
        self.long_side = sam_model.image_encoder.img_size
        self.reset_image()

    @property
    def device(self) -> torch.device:
        return self.model.device

    # --- one image at a time, as segment_anything ------------------------------------------
    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Embed an HxWxC uint8 image (grayscale and RGBA are converted) for later predict calls."""
        if image_format not in ("RGB", "BGR"):
            raise ValueError(f"image_format must be 'RGB' or 'BGR', got {image_format!r}")
        image = to_rgb_uint8(image)
        if image_format == "BGR":
            image = image[..., ::-1]
        self.set_torch_image(self._to_input(image)[None], image.shape[:2])

    @torch.no_grad()
    def set_torch_image(self, transformed_image: torch.Tensor, original_image_size: tuple[int, ...]) -> None:
        """Embed a 1x3xHxW image already resized so that its longest side is the encoder's size."""
        if transformed_image.ndim != 4 or transformed_image.shape[1] != 3 or max(transformed_image.shape[2:]) != self.long_side:
            raise ValueError(
                f"set_torch_image expects 1x3xHxW with longest side {self.long_side}, "
                f"got {tuple(transformed_image.shape)}; use set_image for raw images"
            )
        self.reset_image()
        self.original_size = tuple(original_image_size)
        self.input_size = tuple(transformed_image.shape[-2:])
        self.features = self.model.embed_images(self.model.preprocess(transformed_image))
        self.is_image_set = True

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
        coords_t = labels_t = box_t = mask_t = None
        if point_coords is not None:
            if point_labels is None:
                raise ValueError("point_labels must be given with point_coords (1 foreground, 0 background)")
            coords_t, labels_t = self._points_to_torch(np.asarray(point_coords)[None], np.asarray(point_labels)[None], self.original_size)
        if box is not None:
            box_t = self._boxes_to_torch(np.asarray(box).reshape(1, 4), self.original_size)
        if mask_input is not None:
            mask_t = self._to_device(mask_input, torch.float)[None]
        masks, iou, low_res = self.predict_torch(coords_t, labels_t, box_t, mask_t, multimask_output, return_logits)
        return masks[0].cpu().numpy(), iou[0].float().cpu().numpy(), low_res[0].float().cpu().numpy()

    @torch.no_grad()
    def predict_torch(
        self,
        point_coords: torch.Tensor | None,
        point_labels: torch.Tensor | None,
        boxes: torch.Tensor | None = None,
        mask_input: torch.Tensor | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prompts already in the resized frame, as torch tensors (BxNx2, BxN, Bx4, Bx1x256x256)."""
        self._require_image()
        low_res, iou = self._decode(self.features, point_coords, point_labels, boxes, mask_input, multimask_output)
        masks = self.model.postprocess_masks(low_res, self.input_size, self.original_size)
        return (masks if return_logits else masks > self.model.mask_threshold), iou, low_res

    def get_image_embedding(self) -> torch.Tensor:
        self._require_image()
        return self.features

    def reset_image(self) -> None:
        self.is_image_set = False
        self.features = None
        self.original_size = None
        self.input_size = None

    # --- many images with different prompt counts ---------------------------------------------
    @torch.no_grad()
    def predict_batch(
        self, images: list[np.ndarray], prompts: list[Prompts], multimask_output: bool = True
    ) -> list[Prediction]:
        """Embed all images in batches, then decode every image's prompts.

        With the `nt` switch all prompts of all images travel as one jagged NestedTensor through
        the prompt encoder and the mask decoder; otherwise each image's prompts are one call.
        """
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images but {len(prompts)} prompt sets: give one Prompts per image")
        rgb = [to_rgb_uint8(im) for im in images]
        sizes = [im.shape[:2] for im in rgb]
        inputs = [self._to_input(im) for im in rgb]
        input_sizes = [tuple(x.shape[-2:]) for x in inputs]
        batch = torch.cat([self.model.preprocess(x[None]) for x in inputs])
        features = self.model.embed_images(batch)
        torch_prompts = [self._prompts_to_torch(p, size) for p, size in zip(prompts, sizes)]
        if "nt" in getattr(self.model, "switches", ()):
            decoded = self._decode_nested(features, torch_prompts, multimask_output)
        else:
            decoded = [
                self._decode(features[i : i + 1], *tp, None, multimask_output) for i, tp in enumerate(torch_prompts)
            ]
        results = []
        for (low_res, iou), input_size, size in zip(decoded, input_sizes, sizes):
            masks = self.model.postprocess_masks(low_res, input_size, size) > self.model.mask_threshold
            results.append(Prediction(masks, iou, low_res))
        return results

    def _decode_nested(self, features, torch_prompts, multimask_output):
        """One prompt-encoder + mask-decoder pass for the prompts of all images (jagged on prompt count)."""
        kinds = {tuple(t is not None for t in tp) for tp in torch_prompts}
        shapes = {tp[0].shape[1:] for tp in torch_prompts if tp[0] is not None}
        if len(kinds) > 1 or len(shapes) > 1:
            raise ValueError(
                "nt batching needs the same kind of prompt for every image (all points with the same "
                "number of points per prompt, or all boxes); decode mixed prompts without the nt switch"
            )

        counts = [len(tp[0] if tp[0] is not None else tp[2]) for tp in torch_prompts]
        # Offsets from the host-side counts through a pinned copy: as_nested_tensor would build them
        # on the host and copy them from pageable memory (a cudaStreamSynchronize per tensor).
        offsets = self._to_device(np.cumsum([0, *counts]), torch.int64)

        def jagged(i: int):
            if torch_prompts[0][i] is None:
                return None
            values = torch.cat([tp[i] for tp in torch_prompts])
            return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=min(counts), max_seqlen=max(counts))

        coords, labels, boxes = (jagged(i) for i in range(3))
        any_nt = coords if coords is not None else boxes
        # The image each prompt belongs to; output_size is known on the host, so no sync.
        image_index = torch.repeat_interleave(
            torch.arange(len(counts), device=self.device), any_nt.offsets().diff(), output_size=sum(counts)
        )
        coords, labels, boxes = (None if nt is None else nt.values() for nt in (coords, labels, boxes))
        low_res, iou = self._decode(features, coords, labels, boxes, None, multimask_output, image_index)
        # Split by the host-side counts: unbinding a jagged tensor would read its offsets back (a sync).
        return list(zip(low_res.split(counts), iou.split(counts)))

    # --- helpers -------------------------------------------------------------------------------
    def _decode(self, features, coords, labels, boxes, mask_input, multimask_output, image_index=None):
        points = (coords, labels) if coords is not None else None
        sparse, dense = self.model.prompt_encoder(points=points, boxes=boxes, masks=mask_input)
        return self.model.mask_decoder(
            image_embeddings=features,
            image_pe=self.model.prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=multimask_output,
            image_index=image_index,
        )

    def _to_device(self, array, dtype: torch.dtype) -> torch.Tensor:
        """Host array -> model device without a sync: a copy from pageable memory makes the CPU
        wait for the GPU (cudaStreamSynchronize, found by parity.checks.syncs); pinned does not."""
        tensor = torch.as_tensor(np.asarray(array), dtype=dtype)
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _to_input(self, rgb: np.ndarray) -> torch.Tensor:
        resized = resize_longest_side(rgb, self.long_side)
        return self._to_device(resized, torch.uint8).permute(2, 0, 1).contiguous()

    def _points_to_torch(self, coords, labels, original_size):
        if coords.shape[:-1] != labels.shape or coords.shape[-1] != 2:
            raise ValueError(f"point_coords {coords.shape} must be (..., 2) and point_labels {labels.shape} match its leading shape")
        check_inside(coords, original_size, "point")
        coords = scale_coords(coords, original_size, self.long_side)
        return (
            self._to_device(coords, torch.float),
            self._to_device(labels, torch.int),
        )

    def _boxes_to_torch(self, boxes, original_size):
        boxes = np.asarray(boxes, dtype=float).reshape(-1, 2, 2)
        check_inside(boxes, original_size, "box corner")
        if (boxes[:, 1] < boxes[:, 0]).any():
            raise ValueError("boxes must be x0, y0, x1, y1 with x1 >= x0 and y1 >= y0")
        scaled = scale_coords(boxes, original_size, self.long_side).reshape(-1, 4)
        return self._to_device(scaled, torch.float)

    def _prompts_to_torch(self, prompts: Prompts, original_size):
        coords = labels = boxes = None
        if prompts.point_coords is not None:
            coords, labels = self._points_to_torch(np.asarray(prompts.point_coords), np.asarray(prompts.point_labels), original_size)
        if prompts.boxes is not None:
            boxes = self._boxes_to_torch(prompts.boxes, original_size)
        if coords is None and boxes is None:
            raise ValueError("each Prompts needs point_coords/point_labels or boxes")
        return coords, labels, boxes

    def _require_image(self) -> None:
        if not self.is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")
