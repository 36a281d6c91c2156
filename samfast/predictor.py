"""SamPredictor: the reference's API (set_image, predict, predict_torch) plus batched prediction over many images."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from samfast.families import ServesFamilies
from samfast.resize import pil_bilinear_resize, same_as_pil
from samfast.transfer import to_device
from samfast.transforms import (
    InputError,
    as_numbers,
    check_inside,
    check_labels,
    preprocess_shape,
    resize_longest_side,
    scale_coords,
    to_rgb_uint8,
)


@dataclass
class Prompts:
    """Prompts for one image in original-image pixels: N prompts of k points each, and/or N boxes.

    Points are (N, k, 2). An (N, 2) array is refused rather than guessed: it could mean N prompts
    of one point or one prompt of N points; write (N, 1, 2) or (1, N, 2). No points and no boxes,
    or arrays of length 0, mean no prompts: that image's Prediction is empty.
    """

    point_coords: np.ndarray | None = None  # (N, k, 2) as (x, y)
    point_labels: np.ndarray | None = None  # (N, k): 1 foreground, 0 background
    boxes: np.ndarray | None = None  # (N, 4) as x0, y0, x1, y1

    def __len__(self) -> int:
        given = self.point_coords if self.point_coords is not None else self.boxes
        return 0 if given is None else len(given)


@dataclass
class Prediction:
    masks: torch.Tensor  # (N, C, H, W) bool (or logits with return_logits), original image size
    iou_predictions: torch.Tensor  # (N, C)
    low_res_logits: torch.Tensor  # (N, C, 256, 256)


class SamPredictor(ServesFamilies):
    """Given a SAM 2 model it is samfast.sam2.predictor.SamPredictorForSAM2 (set_image and predict as here)."""

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
            raise InputError(f"image_format must be 'RGB' or 'BGR', got {image_format!r}")
        image = to_rgb_uint8(image)
        if image_format == "BGR":
            image = image[..., ::-1]
        self.set_torch_image(self._to_input(image)[None], image.shape[:2])

    @torch.no_grad()
    def set_torch_image(self, transformed_image: torch.Tensor, original_image_size: tuple[int, ...]) -> None:
        """Embed a 1x3xHxW image already resized so that its longest side is the encoder's size."""
        if transformed_image.ndim != 4 or transformed_image.shape[1] != 3 or max(transformed_image.shape[2:]) != self.long_side:
            raise InputError(
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
        if point_coords is not None or point_labels is not None:
            if point_labels is None:
                raise InputError("point_labels must be given with point_coords (1 foreground, 0 background)")
            if point_coords is None:
                raise InputError("point_coords must be given with point_labels: one (x, y) per label")
            coords = as_numbers(point_coords, "point_coords")
            if coords.ndim != 2 or coords.shape[1] != 2:
                raise InputError(
                    f"point_coords must be (k, 2), the k points of one prompt, got shape {coords.shape}; "
                    "for many prompts use predict_batch with Prompts"
                )
            labels = as_numbers(point_labels, "point_labels")
            coords_t, labels_t = self._points_to_torch(coords[None], labels[None], self.original_size, "point")
        if box is not None:
            box = as_numbers(box, "box")
            if box.size != 4:
                raise InputError(f"box must be 4 numbers x0, y0, x1, y1, got shape {box.shape}")
            box_t = self._boxes_to_torch(box.reshape(1, 4), self.original_size, "box")
        if mask_input is not None:
            mask = as_numbers(mask_input, "mask_input")
            expected = (1, *self._prompt_encoder().mask_input_size)
            if mask.shape != expected:
                raise InputError(
                    f"mask_input must be {expected}, e.g. low_res_logits[i][None] of an earlier predict, got {mask.shape}"
                )
            mask_t = to_device(mask, torch.float, self.device)[None]
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
        rgb, sizes, torch_prompts, results, active = self._checked_batch(images, prompts, multimask_output)
        if not active:
            return results
        active_prompts = [torch_prompts[i] for i in active]
        nested = "nt" in getattr(self.model, "switches", ())
        if nested:
            check_one_prompt_kind(active_prompts)
        inputs = [self._to_input(rgb[i]) for i in active]
        batch = torch.cat([self.model.preprocess(x[None]) for x in inputs])
        features = self.model.embed_images(batch)
        if nested:
            decoded = self._decode_nested(features, active_prompts, multimask_output)
        else:
            decoded = [
                self._decode(features[j : j + 1], *tp, None, multimask_output) for j, tp in enumerate(active_prompts)
            ]
        for i, x, (low_res, iou) in zip(active, inputs, decoded):
            masks = self.model.postprocess_masks(low_res, tuple(x.shape[-2:]), sizes[i]) > self.model.mask_threshold
            results[i] = Prediction(masks, iou, low_res)
        return results

    def _checked_batch(self, images, prompts, multimask_output: bool):
        """(RGB images, their sizes, each image's prompts as device tensors (None: no prompt), an empty
        Prediction per image, the indices of the images with prompts). Every prompt is checked before
        an encoder runs: a bad one costs no encoder time."""
        if len(images) != len(prompts):
            raise InputError(f"{len(images)} images but {len(prompts)} prompt sets: give one Prompts per image")
        rgb = [to_rgb_uint8(im, f"images[{i}]") for i, im in enumerate(images)]
        sizes = [im.shape[:2] for im in rgb]
        torch_prompts = [self._prompts_to_torch(p, size, f"prompts[{i}]") for i, (p, size) in enumerate(zip(prompts, sizes))]
        results = [self._empty_prediction(size, multimask_output) for size in sizes]
        return rgb, sizes, torch_prompts, results, [i for i, tp in enumerate(torch_prompts) if tp is not None]

    def _empty_prediction(self, size: tuple[int, int], multimask_output: bool) -> Prediction:
        """The Prediction of an image without prompts: every field with 0 rows and the usual other axes."""
        outputs = 3 if multimask_output else 1
        empty = dict(device=self.device, dtype=self.model.dtype)
        return Prediction(
            masks=torch.zeros((0, outputs, *size), dtype=torch.bool, device=self.device),
            iou_predictions=torch.zeros((0, outputs), **empty),
            low_res_logits=torch.zeros((0, outputs, *self._prompt_encoder().mask_input_size), **empty),
        )

    def _decode_nested(self, features, torch_prompts, multimask_output):
        """One prompt-encoder + mask-decoder pass for the prompts of all images (jagged on prompt count)."""
        counts = [len(tp[0] if tp[0] is not None else tp[2]) for tp in torch_prompts]
        # Offsets from the host-side counts through a pinned copy: as_nested_tensor would build them
        # on the host and copy them from pageable memory (a cudaStreamSynchronize per tensor).
        offsets = to_device(np.cumsum([0, *counts]), torch.int64, self.device)

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

    def _to_input(self, rgb: np.ndarray) -> torch.Tensor:
        """3xhxw uint8 on the model's device, the longest side resized to the encoder's, PIL's exact pixels.

        On a GPU the original (smaller, usually) is copied and resized there (samfast.resize): a host
        resize plus the copy of its result cost more than the vit_b encoder. Where the device resize
        may not equal the installed PIL's, PIL resizes on the host as the reference does.
        """
        size = preprocess_shape(*rgb.shape[:2], self.long_side)
        if self.device.type == "cuda" and same_as_pil(rgb.shape[:2], size):
            resized = pil_bilinear_resize(to_device(np.ascontiguousarray(rgb), torch.uint8, self.device), size)
        else:
            resized = to_device(resize_longest_side(rgb, self.long_side), torch.uint8, self.device)
        return resized.permute(2, 0, 1).contiguous()

    def _points_to_torch(self, coords: np.ndarray, labels: np.ndarray, original_size, what: str):
        """Checked (N, k, 2) coordinates and (N, k) labels -> device tensors in the resized frame."""
        if labels.shape != coords.shape[:-1]:
            raise InputError(
                f"{what} labels of shape {labels.shape} do not match coordinates {coords.shape}: one label per point"
            )
        if coords.shape[1] == 0:
            raise InputError(f"{what} prompts hold no point (shape {coords.shape}); each prompt needs at least one")
        check_labels(labels, what)
        check_inside(coords, original_size, what)
        coords = self._to_model_frame(coords, original_size)
        return to_device(coords, torch.float, self.device), to_device(labels, torch.int, self.device)

    def _boxes_to_torch(self, boxes: np.ndarray, original_size, what: str):
        """Checked (N, 4) boxes -> a device tensor in the resized frame."""
        corners = boxes.reshape(-1, 2, 2)
        check_inside(corners, original_size, f"{what} corner")
        inverted = (corners[:, 1] < corners[:, 0]).any(axis=1)
        if inverted.any():
            raise InputError(
                f"{what} {boxes[np.argmax(inverted)].tolist()} is inverted: boxes are x0, y0, x1, y1 "
                "with x1 >= x0 and y1 >= y0"
            )
        scaled = self._to_model_frame(corners, original_size).reshape(-1, 4)
        return to_device(scaled, torch.float, self.device)

    def _to_model_frame(self, coords: np.ndarray, original_size) -> np.ndarray:
        """(..., 2) pixel coordinates of the original image -> the frame the prompt encoder reads
        (SAM 1: the image resized so that its longest side is the encoder's)."""
        return scale_coords(coords, original_size, self.long_side)

    def _prompts_to_torch(self, prompts: Prompts, original_size, where: str):
        """(coords, labels, boxes) device tensors of one image's checked prompts; None when it has none."""
        if not isinstance(prompts, Prompts):
            raise InputError(f"{where} must be a samfast.Prompts, got {type(prompts).__name__}")
        coords = labels = boxes = None
        counts = {}
        if prompts.point_coords is not None or prompts.point_labels is not None:
            if prompts.point_coords is None or prompts.point_labels is None:
                raise InputError(f"{where}: point_coords and point_labels go together (one label per point)")
            coords = as_numbers(prompts.point_coords, f"{where}.point_coords")
            labels = as_numbers(prompts.point_labels, f"{where}.point_labels")
            counts["point prompts"] = _count(coords, (None, None, 2), f"{where}.point_coords")
            counts["point labels"] = _count(labels, (None, None), f"{where}.point_labels")
        if prompts.boxes is not None:
            boxes = as_numbers(prompts.boxes, f"{where}.boxes")
            counts["boxes"] = _count(boxes, (None, 4), f"{where}.boxes")
        if len(set(counts.values())) > 1:
            raise InputError(f"{where}: " + ", ".join(f"{n} {what}" for what, n in counts.items()) + "; give one of each per prompt")
        if not counts or 0 in counts.values():
            return None
        if coords is not None:
            coords, labels = self._points_to_torch(coords, labels, original_size, f"{where} point")
        if boxes is not None:
            boxes = self._boxes_to_torch(boxes, original_size, f"{where} box")
        return coords, labels, boxes

    def _prompt_encoder(self):
        return self.model.prompt_encoder

    def _require_image(self) -> None:
        if not self.is_image_set:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")


def check_one_prompt_kind(torch_prompts) -> None:
    """The nt switch decodes all images' prompts as one jagged batch: they must be of one kind."""
    kinds = {tuple(t is not None for t in tp) for tp in torch_prompts}
    shapes = {tp[0].shape[1:] for tp in torch_prompts if tp[0] is not None}
    if len(kinds) > 1 or len(shapes) > 1:
        raise InputError(
            "nt batching needs the same kind of prompt for every image (all points with the same "
            "number of points per prompt, or all boxes); decode mixed prompts without the nt switch"
        )


def _count(array: np.ndarray, shape: tuple, name: str) -> int:
    """The number of prompts in `array` (its first axis) after checking it has `shape` (None: any
    length); an empty first axis means no prompts, whatever the rest."""
    if array.ndim and array.shape[0] == 0:
        return 0
    fits = array.ndim == len(shape) and all(want in (None, got) for want, got in zip(shape, array.shape))
    if fits:
        return array.shape[0]
    wanted = "(" + ", ".join("N" if i == 0 else ("k" if want is None else str(want)) for i, want in enumerate(shape)) + ")"
    if shape == (None, None, 2) and array.shape[1:] == (2,):
        n = array.shape[0]
        raise InputError(
            f"{name} has shape {array.shape}, which could be {n} prompts of one point or one prompt of {n} "
            f"points: pass ({n}, 1, 2) for the first, (1, {n}, 2) for the second"
        )
    raise InputError(f"{name} must be {wanted}, got shape {array.shape}")
