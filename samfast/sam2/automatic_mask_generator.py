"""SAM2AutomaticMaskGenerator: sam2's "segment everything", its parameters, defaults and records.

samfast's shared generator (samfast.amg: grids, crop boxes, filters, NMS, RLE) does the work; only
what sam2's algorithm does differently lives here:
- each crop is stretched to 1024 x 1024 and its features include the two high-resolution levels;
- grid points are rounded to float32, then normalized by the crop size (sam2's transform_coords);
- use_m2m decodes every mask once more, fed its own clamped low-res logits as the mask prompt,
  one mask per prompt, and the refined mask and score replace the first ones before any filter;
- mask_threshold and multimask_output are parameters (one mask per point without multimask);
- min_mask_region_area goes to the predictor's hole and sprinkle removal, as sam2 hands it over
  (sam2 skips it with a warning without its CUDA extension, and so does samfast), not to the
  small-region clean-up after NMS of SAM 1's generator.
In fp32 on the CPU the records equal sam2's (tests/unit/test_sam2_amg.py).
"""

from __future__ import annotations

import numpy as np
import torch

from samfast.amg.generator import ENCODER_BATCH, SamAutomaticMaskGenerator, _Crop
from samfast.modeling.sam2_prompting.image_predictor import SAM2ImagePredictor
from samfast.sam2.sam2_base import SAM2Base
from samfast.transfer import to_device

# sam2 clamps the low-res logits it returns, and so the mask prompts of the m2m pass, to this
LOW_RES_CLAMP = 32.0


class SAM2AutomaticMaskGenerator(SamAutomaticMaskGenerator, serves=SAM2Base):
    """sam2's SAM2AutomaticMaskGenerator: generate(image) -> records with the keys segmentation, area,
    bbox, predicted_iou, point_coords, stability_score, crop_box. points_per_batch=None decodes as
    many of a crop's points in one call as fit in memory (all of them on a large GPU, usually; 64 on
    a CPU), as SAM 1's generator does. Extra keyword arguments are accepted and ignored, as sam2 does."""

    point_dtype = np.float32
    removes_small_regions = False

    def __init__(
        self,
        model: SAM2Base,
        points_per_side: int | None = 32,
        points_per_batch: int | None = 64,
        pred_iou_thresh: float = 0.8,
        stability_score_thresh: float = 0.95,
        stability_score_offset: float = 1.0,
        mask_threshold: float = 0.0,
        box_nms_thresh: float = 0.7,
        crop_n_layers: int = 0,
        crop_nms_thresh: float = 0.7,
        crop_overlap_ratio: float = 512 / 1500,
        crop_n_points_downscale_factor: int = 1,
        point_grids: list[np.ndarray] | None = None,
        min_mask_region_area: int = 0,
        output_mode: str = "binary_mask",
        use_m2m: bool = False,
        multimask_output: bool = True,
        **kwargs,
    ) -> None:
        self._mask_threshold = mask_threshold
        self.use_m2m = use_m2m
        self.multimask_output = multimask_output
        super().__init__(
            model, points_per_side, points_per_batch, pred_iou_thresh, stability_score_thresh,
            stability_score_offset, box_nms_thresh, crop_n_layers, crop_nms_thresh, crop_overlap_ratio,
            crop_n_points_downscale_factor, point_grids, min_mask_region_area, output_mode,
        )

    def _new_predictor(self, model: SAM2Base) -> SAM2ImagePredictor:
        return SAM2ImagePredictor(model, max_hole_area=self.min_mask_region_area, max_sprinkle_area=self.min_mask_region_area)

    def _prompt_encoder(self):
        return self.model.sam_prompt_encoder

    @property
    def mask_threshold(self) -> float:
        return self._mask_threshold

    @property
    def masks_per_point(self) -> int:
        return 3 if self.multimask_output else 1

    def _embed(self, images: list[np.ndarray], crops: list[_Crop]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(image embeddings (n_crops, 256, 64, 64), [its two high-resolution levels]), in encoder batches."""
        inputs = torch.stack([
            self.predictor._transforms(np.ascontiguousarray(images[c.image][c.box[1] : c.box[3], c.box[0] : c.box[2]]))
            for c in crops
        ])
        inputs = to_device(inputs, torch.float, self.predictor.device)
        batches = [self.model.image_features(inputs[s : s + ENCODER_BATCH]) for s in range(0, len(inputs), ENCODER_BATCH)]
        embeds, high_res = zip(*batches)
        return torch.cat(embeds), [torch.cat(level) for level in zip(*high_res)]

    def _decode(self, features, crops: list[_Crop]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per crop: low-res logits (P * C, 256, 256) and IoUs (P * C,), point-major, m2m-refined with use_m2m."""
        embeds, high_res = features
        logits, ious = [], []
        for c, crop in enumerate(crops):
            own = (embeds[c : c + 1], [level[c : c + 1] for level in high_res])
            points = to_device(crop.points, torch.float32, self.predictor.device)  # point_dtype: float32
            step = self._points_per_call(len(points))
            batches = [self._decode_points(batch, crop, own, step) for batch in points.split(step)]
            logits.append(torch.cat([b[0] for b in batches]))
            ious.append(torch.cat([b[1] for b in batches]).float())
        return logits, ious

    def _decode_points(self, points: torch.Tensor, crop: _Crop, features, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """sam2's _process_batch up to its filters, for one batch of (P, 2) float32 points in crop pixels."""
        in_points = self.predictor._transforms.transform_coords(points, normalize=True, orig_hw=crop.size)
        labels = torch.ones(len(in_points), 1, dtype=torch.int, device=in_points.device)
        low_res, iou = self.predictor._decode(in_points[:, None, :], labels, None, None, self.multimask_output, *features)
        low_res, iou = low_res.flatten(0, 1), iou.flatten(0, 1)
        if not self.use_m2m:
            return low_res, iou
        # sam2's refine_with_m2m: its batches of points_per_batch run over the flattened masks
        in_points = in_points.repeat_interleave(self.masks_per_point, dim=0)
        mask_prompts = low_res.clamp(-LOW_RES_CLAMP, LOW_RES_CLAMP)
        refined = [
            self.predictor._decode(p[:, None, :], labels.new_ones(len(p), 1), None, m[:, None], False, *features)
            for p, m in zip(in_points.split(step), mask_prompts.split(step))
        ]
        return torch.cat([r[0] for r in refined]).squeeze(1), torch.cat([r[1] for r in refined]).squeeze(1)

    def _upsample(self, logits: torch.Tensor, crop: _Crop) -> torch.Tensor:
        """Low-res logits (n, 256, 256) -> fp32 logits (n, h, w) of the crop, as sam2's predictor upsamples."""
        return self.predictor._transforms.postprocess_masks(logits[:, None], crop.size)[:, 0]
