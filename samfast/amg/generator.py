"""SamAutomaticMaskGenerator: segment_anything's "segment everything" with the same records, on the device.

The reference decodes 64 points at a time and, per batch, upsamples all 192 masks to full size,
scores them, and encodes every survivor to RLE with a Python loop and a host transfer per mask:
its host-device syncs grow with the number of batches. Here, per image batch:

1. every crop of every image goes through the encoder in batches (one call for many images);
2. the points of all crops decode in as few mask-decoder calls as memory allows, each prompt
   attending to its own crop's embedding (the decoder's image_index), all results kept on the device;
3. per crop, on the device: predicted-IoU filter, stability score and box on full-size logits
   (upsampled only for the masks that passed the IoU filter, in chunks), crop-edge filter, NMS;
4. per image: NMS across crops, the survivors upsampled once more, RLE change points found on the
   device, and everything fetched in one transfer.

Syncs per image are a fixed handful (two filters, the NMS calls, the RLE's nonzero, the final
fetch) whatever points_per_batch is. The filters keep the reference's order, so on the CPU in
fp32 the records equal the reference's: same count, same order, same masks up to logits that sit
within fp32 rounding of the threshold (tests/unit/test_amg.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.ops import batched_nms

from samfast.amg import rle as rle_utils
from samfast.amg.grids import crop_boxes, layer_point_grids
from samfast.amg.masks import mask_boxes, near_crop_edge, stability_score
from samfast.amg.small_regions import postprocess_small_regions
from samfast.families import ServesFamilies
from samfast.predictor import SamPredictor
from samfast.transforms import InputError, preprocess_shape, scale_coords, to_rgb_uint8
from samfast.transfer import to_device

OUTPUT_MODES = ("binary_mask", "uncompressed_rle", "coco_rle")
MASKS_PER_POINT = 3  # multimask output: every point prompt gives 3 masks, flattened point-major
ENCODER_BATCH = 8  # crops per encoder call when the model has no static (compiled) batch size
UPSAMPLE_CHUNK = 64  # masks upsampled to full size at once to score them (~64 full-size fp32 logit maps)
CPU_POINTS_PER_BATCH = 64  # points_per_batch=None on the CPU, where memory is not the limit
# points_per_batch=None on CUDA: how many image-embedding-sized activations one prompt holds at the
# decoder's peak (the two-way transformer's per-prompt image tokens and projections, the 4x upscaled
# features; counted from when the embedding was also copied per prompt, so an upper bound now that
# the first layer works per image), and the share of free memory the decoder may take.
DECODER_ACTIVATIONS_PER_PROMPT = 16
DECODER_MEMORY_SHARE = 0.5


@dataclass
class _Crop:
    image: int  # index of its image in the batch
    box: list[int]  # x0, y0, x1, y1 in the image
    points: np.ndarray  # (P, 2) float64 (x, y) prompts in crop pixels

    @property
    def size(self) -> tuple[int, int]:
        x0, y0, x1, y1 = self.box
        return y1 - y0, x1 - x0


@dataclass
class _Kept:
    """A crop's masks after its own filters and NMS, on the device, in the reference's order."""

    crop: int
    index: torch.Tensor  # (k,) into the crop's flattened outputs: point * masks_per_point + output
    boxes: torch.Tensor  # (k, 4) int64 x0, y0, x1, y1 in the image
    iou: torch.Tensor  # (k,) float32
    stability: torch.Tensor  # (k,) float32


class SamAutomaticMaskGenerator(ServesFamilies):
    """Masks for a whole image from a grid of point prompts: segment_anything's API and records.

    points_per_batch: points per mask-decoder call; None decodes as many as fit in memory (all of
    them, usually). generate_batch(images) runs several images through the encoder together.
    Given a SAM 2 model it is samfast.sam2.SAM2AutomaticMaskGenerator, with sam2's parameters.
    """

    # What a family's subclass may change (samfast.sam2's does):
    masks_per_point = MASKS_PER_POINT
    point_dtype = np.float64  # the grid points in crop pixels, as the reference keeps them
    removes_small_regions = True  # min_mask_region_area cleans the surviving masks after NMS

    def __init__(
        self,
        model,
        points_per_side: int | None = 32,
        points_per_batch: int | None = 64,
        pred_iou_thresh: float = 0.88,
        stability_score_thresh: float = 0.95,
        stability_score_offset: float = 1.0,
        box_nms_thresh: float = 0.7,
        crop_n_layers: int = 0,
        crop_nms_thresh: float = 0.7,
        crop_overlap_ratio: float = 512 / 1500,
        crop_n_points_downscale_factor: int = 1,
        point_grids: list[np.ndarray] | None = None,
        min_mask_region_area: int = 0,
        output_mode: str = "binary_mask",
    ) -> None:
        if (points_per_side is None) == (point_grids is None):
            raise InputError("give exactly one of points_per_side (a regular grid) or point_grids (explicit [0, 1] points per crop layer)")
        if points_per_side is not None and points_per_side < 1:
            raise InputError(f"points_per_side must be at least 1 (points along each side of the grid), got {points_per_side}")
        if crop_n_layers < 0:
            raise InputError(f"crop_n_layers must be 0 (the whole image only) or more (layers of crops), got {crop_n_layers}")
        if crop_n_points_downscale_factor < 1:
            raise InputError("crop_n_points_downscale_factor must be at least 1 (1: every layer keeps the full grid), "
                             f"got {crop_n_points_downscale_factor}")
        if point_grids is not None and len(point_grids) != crop_n_layers + 1:
            raise InputError(f"point_grids needs one grid per crop layer: {crop_n_layers + 1} for crop_n_layers={crop_n_layers}, got {len(point_grids)}")
        if output_mode not in OUTPUT_MODES:
            raise InputError(f"unknown output_mode {output_mode!r}; choose from {', '.join(OUTPUT_MODES)}")
        if points_per_batch is not None and points_per_batch < 1:
            raise InputError(f"points_per_batch must be a positive number of points or None (as many as fit), got {points_per_batch}")
        if min_mask_region_area < 0:
            raise InputError(f"min_mask_region_area must be 0 (off) or a positive area in pixels, got {min_mask_region_area}")
        if points_per_side is not None:
            point_grids = layer_point_grids(points_per_side, crop_n_layers, crop_n_points_downscale_factor)
        self.point_grids = [np.asarray(g, dtype=np.float64) for g in point_grids]
        self.points_per_batch = points_per_batch
        self.pred_iou_thresh = pred_iou_thresh
        self.stability_score_thresh = stability_score_thresh
        self.stability_score_offset = stability_score_offset
        self.box_nms_thresh = box_nms_thresh
        self.crop_n_layers = crop_n_layers
        self.crop_nms_thresh = crop_nms_thresh
        self.crop_overlap_ratio = crop_overlap_ratio
        self.crop_n_points_downscale_factor = crop_n_points_downscale_factor
        self.min_mask_region_area = min_mask_region_area
        self.output_mode = output_mode
        self.predictor = self._new_predictor(model)

    def _new_predictor(self, model):
        return SamPredictor(model)

    @property
    def model(self):
        return self.predictor.model

    def _prompt_encoder(self):
        """The model's prompt encoder (the family's name for it: SAM 2's is sam_prompt_encoder)."""
        return self.model.prompt_encoder

    @property
    def mask_threshold(self) -> float:
        """The logit above which a pixel is in a mask: the model's here, a parameter in sam2's generator."""
        return self.model.mask_threshold

    @torch.no_grad()
    def generate(self, image: np.ndarray) -> list[dict]:
        """Mask records of one HxWx3 uint8 RGB image, as segment_anything's generate returns them."""
        return self.generate_batch([image])[0]

    @torch.no_grad()
    def generate_batch(self, images: list[np.ndarray]) -> list[list[dict]]:
        """generate for several images, their crops encoded and decoded together."""
        images = [to_rgb_uint8(im) for im in images]
        crops = [
            _Crop(i, box, (self.point_grids[layer] * np.array([box[2] - box[0], box[3] - box[1]], dtype=np.float64)).astype(self.point_dtype))
            for i, im in enumerate(images)
            for box, layer in crop_boxes(im.shape[:2], self.crop_n_layers, self.crop_overlap_ratio)
        ]
        features = self._embed(images, crops)
        logits, iou = self._decode(features, crops)
        records = []
        for i, image in enumerate(images):
            own = [c for c, crop in enumerate(crops) if crop.image == i]
            kept = [self._filter_crop(c, crops[c], logits[c], iou[c], image.shape[:2]) for c in own]
            records.append(self._records(kept, crops, logits, image.shape[:2]))
        return records

    # --- model ---------------------------------------------------------------------------------
    def _embed(self, images: list[np.ndarray], crops: list[_Crop]) -> torch.Tensor:
        """Image embeddings (n_crops, C, h, w), in encoder batches."""
        inputs = []
        for crop in crops:
            x0, y0, x1, y1 = crop.box
            pixels = self.predictor._to_input(np.ascontiguousarray(images[crop.image][y0:y1, x0:x1]))
            inputs.append(self.model.preprocess(pixels[None]))
        batch = torch.cat(inputs)
        # with a static batch (compile), embed_images pads or splits to exactly that size itself
        step = self.model.static_batch or ENCODER_BATCH
        return torch.cat([self.model.embed_images(batch[s : s + step]) for s in range(0, len(batch), step)])

    def _decode(self, features: torch.Tensor, crops: list[_Crop]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per crop: low-res logits (P * 3, 256, 256) and predicted IoUs (P * 3,), point-major as the reference flattens them."""
        long_side = self.predictor.long_side
        coords = np.concatenate([scale_coords(c.points, c.size, long_side) for c in crops])
        crop_index = np.concatenate([np.full(len(c.points), i) for i, c in enumerate(crops)])
        # float64 as the reference feeds them: the prompt encoder rounds after adding the half pixel
        coords = to_device(coords[:, None, :], torch.float64, self.predictor.device)
        crop_index = to_device(crop_index, torch.int64, self.predictor.device)
        labels = torch.ones(len(coords), 1, dtype=torch.int, device=self.model.device)
        image_pe = self._prompt_encoder().get_dense_pe()
        step = self._points_per_call(len(coords))
        logits, iou = [], []
        for s in range(0, len(coords), step):
            sparse, dense = self._prompt_encoder()(points=(coords[s : s + step], labels[s : s + step]), boxes=None, masks=None)
            batch_logits, batch_iou = self.model.mask_decoder(
                image_embeddings=features,
                image_pe=image_pe,
                sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense,
                multimask_output=True,
                image_index=crop_index[s : s + step],
            )
            logits.append(batch_logits)
            iou.append(batch_iou)
        per_crop = [self.masks_per_point * len(c.points) for c in crops]
        logits = torch.cat(logits).flatten(0, 1).split(per_crop)
        iou = torch.cat(iou).flatten(0, 1).float().split(per_crop)
        return list(logits), list(iou)

    def _points_per_call(self, n_points: int) -> int:
        if self.points_per_batch is not None:
            return self.points_per_batch
        if self.model.device.type != "cuda":
            return min(n_points, CPU_POINTS_PER_BATCH)
        free, _ = torch.cuda.mem_get_info(self.model.device)
        # blocks the caching allocator holds but nothing uses are free to the decoder too: without them
        # the count depended on what earlier calls had left cached (1024 points split into 1014 + 10)
        free += torch.cuda.memory_reserved(self.model.device) - torch.cuda.memory_allocated(self.model.device)
        prompt_encoder = self._prompt_encoder()
        embedding = prompt_encoder.no_mask_embed.weight
        h, w = prompt_encoder.image_embedding_size
        per_prompt = DECODER_ACTIVATIONS_PER_PROMPT * embedding.shape[1] * h * w * embedding.element_size()
        return max(1, min(n_points, int(free * DECODER_MEMORY_SHARE // per_prompt)))

    def _upsample(self, logits: torch.Tensor, crop: _Crop) -> torch.Tensor:
        """Low-res logits (n, 256, 256) -> fp32 logits (n, h, w) of the crop, as the predictor upsamples."""
        input_size = preprocess_shape(*crop.size, self.predictor.long_side)
        return self.model.postprocess_masks(logits[:, None], input_size, crop.size)[:, 0]

    # --- filters -------------------------------------------------------------------------------
    def _filter_crop(self, c: int, crop: _Crop, logits: torch.Tensor, iou: torch.Tensor, image_size) -> _Kept:
        """The reference's _process_batch filters then its per-crop NMS, over all the crop's masks at once."""
        index, stability, boxes = self._candidates(crop, logits, iou, image_size)
        keep = batched_nms(boxes.float(), iou[index], torch.zeros_like(index), self.box_nms_thresh)  # syncs inside
        return self._kept(c, crop, index[keep], stability[keep], boxes[keep], iou)

    def _candidates(self, crop: _Crop, logits: torch.Tensor, iou: torch.Tensor, image_size):
        """The crop's masks that pass the score filters, off the crop's edge: index into the crop's outputs,
        stability scores and boxes (x0, y0, x1, y1 in crop pixels), NMS still to come."""
        threshold = self.mask_threshold
        if self.pred_iou_thresh > 0.0:
            index = torch.nonzero(iou > self.pred_iou_thresh)[:, 0]  # sync: the survivors' count
        else:
            index = torch.arange(len(iou), device=iou.device)
        stability = iou.new_empty(0)
        boxes = torch.zeros(0, 4, dtype=torch.int64, device=iou.device)
        for chunk in index.split(UPSAMPLE_CHUNK):
            full = self._upsample(logits[chunk], crop)
            stability = torch.cat([stability, stability_score(full, threshold, self.stability_score_offset)])
            boxes = torch.cat([boxes, mask_boxes(full > threshold)])
        keep = ~near_crop_edge(boxes, crop.box, image_size)
        if self.stability_score_thresh > 0.0:
            keep &= stability >= self.stability_score_thresh
        keep = torch.nonzero(keep)[:, 0]  # sync
        return index[keep], stability[keep], boxes[keep]

    @staticmethod
    def _kept(c: int, crop: _Crop, index: torch.Tensor, stability: torch.Tensor, boxes: torch.Tensor,
              iou: torch.Tensor) -> _Kept:
        x0, y0 = crop.box[:2]
        # Python offsets: a tensor of them would be a host-to-device copy
        boxes = torch.stack([boxes[:, 0] + x0, boxes[:, 1] + y0, boxes[:, 2] + x0, boxes[:, 3] + y0], dim=1)
        return _Kept(c, index, boxes, iou[index], stability)

    def _across_crops(self, kept: list[_Kept], crops: list[_Crop]) -> torch.Tensor:
        """Order (indices into the concatenated kept masks) after NMS between crops, preferring smaller crops."""
        boxes = torch.cat([k.boxes for k in kept])
        if len(kept) == 1:
            return torch.arange(len(boxes), device=boxes.device)
        # the reference's 1 / box_area(crop_boxes): an int64 area divided into 1 in float32
        areas = [np.prod(crops[k.crop].size) for k in kept]
        scores = torch.cat([torch.full((len(k.index),), int(a), dtype=torch.int64, device=boxes.device) for k, a in zip(kept, areas)])
        return batched_nms(boxes.float(), 1 / scores, torch.zeros_like(scores), self.crop_nms_thresh)

    # --- output --------------------------------------------------------------------------------
    def _records(self, kept: list[_Kept], crops: list[_Crop], logits: list[torch.Tensor], image_size) -> list[dict]:
        order = self._across_crops(kept, crops)
        masks = []
        for k in kept:
            x0, y0, x1, y1 = crops[k.crop].box
            crop_masks = self._upsample(logits[k.crop][k.index], crops[k.crop]) > self.mask_threshold
            masks.append(F.pad(crop_masks, (x0, image_size[1] - x1, y0, image_size[0] - y1), value=False))
        masks = torch.cat(masks)[order]
        crop_of = torch.cat([torch.full_like(k.index, i) for i, k in enumerate(kept)])[order]
        index = torch.cat([k.index for k in kept])[order]
        boxes = torch.cat([k.boxes for k in kept])[order]
        iou = torch.cat([k.iou for k in kept])[order]
        stability = torch.cat([k.stability for k in kept])[order]
        if self.removes_small_regions and self.min_mask_region_area > 0 and len(masks):
            # one more device-to-host copy (a sync) of the surviving masks, as in the reference
            keep, masks, boxes = postprocess_small_regions(
                masks, self.min_mask_region_area, max(self.box_nms_thresh, self.crop_nms_thresh))
            crop_of, index, iou, stability = (t[keep.to(t.device)] for t in (crop_of, index, iou, stability))
        encoded = rle_utils.change_points(masks)  # sync (nonzero)
        first, changes, crop_of, index, boxes, iou, stability = _fetch(
            encoded.first_value, encoded.changes, crop_of, index, boxes, iou, stability
        )
        rles = rle_utils.uncompressed_rles(first, changes, encoded.size)
        records = []
        for i, rle in enumerate(rles):
            crop = crops[kept[crop_of[i]].crop]
            x0, y0, x1, y1 = crop.box
            px, py = crop.points[index[i] // self.masks_per_point]
            bx0, by0, bx1, by1 = boxes[i].tolist()
            records.append({
                "segmentation": self._segmentation(rle),
                "area": rle_utils.rle_area(rle),
                "bbox": [bx0, by0, bx1 - bx0, by1 - by0],
                "predicted_iou": iou[i].item(),
                "point_coords": [[float(px + x0), float(py + y0)]],
                "stability_score": stability[i].item(),
                "crop_box": [x0, y0, x1 - x0, y1 - y0],
            })
        return records

    def _segmentation(self, rle: dict):
        if self.output_mode == "binary_mask":
            return rle_utils.rle_to_mask(rle)
        if self.output_mode == "coco_rle":
            return rle_utils.coco_rle(rle)
        return rle


def _fetch(*tensors: torch.Tensor) -> list[np.ndarray]:
    """Device tensors -> numpy arrays with one host-device sync for all of them."""
    if tensors[0].device.type != "cuda":
        return [t.numpy() for t in tensors]
    # non_blocking device-to-host copies land in pinned memory; one stream sync waits for them all
    host = [t.to("cpu", non_blocking=True) for t in tensors]
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return [t.numpy() for t in host]
