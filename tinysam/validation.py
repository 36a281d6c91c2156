"""Validation: the published evaluation (one centre point or tight box per object, the output with
the highest predicted IoU, mIoU vs ground truth at full resolution) through samfast.SamPredictor,
on the gate's own data path, prompts and metrics, so a checkpoint is measured as the gate measures it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from parity.compare.metrics import mask_iou, miou_vs_ground_truth
from parity.golden.data import _index
from parity.golden.scenes import generate_scenes
from parity.tasks.point.evaluate import prompts_for
from samfast import SamPredictor
from samfast.config import IMAGE_SIZE
from samfast.transforms import resize_longest_side, scale_coords, to_rgb_uint8

HELDOUT_SEED, HELDOUT_IMAGES = 999, 64  # generate_scenes seed and size of the held-out set (never trained on)


@dataclass
class ValidationSet:
    """Samples with at least one object, and their resized input images once made on a device."""

    name: str
    samples: list
    inputs: list[torch.Tensor] | None = None

    @classmethod
    def of(cls, name: str, dataset) -> ValidationSet:
        return cls(name, [s for s in dataset.samples if s.annotations])

    def input_images(self, device: torch.device) -> list[torch.Tensor]:
        """(1, 3, h, w) uint8 tensors, resized as SamPredictor.set_image resizes (longest side 1024)."""
        if self.inputs is None or self.inputs[0].device != device:
            self.inputs = [torch.as_tensor(resize_longest_side(to_rgb_uint8(s.image), IMAGE_SIZE), device=device)
                           .permute(2, 0, 1)[None].contiguous() for s in self.samples]
        return self.inputs


def heldout_dataset(num_images: int = HELDOUT_IMAGES, seed: int = HELDOUT_SEED):
    """generate_scenes(num_images, seed) through parity.golden.data's one loading path (prompts, skips)."""
    coco, images = generate_scenes(num_images, seed=seed)
    return _index(f"scenes-seed{seed}", json.dumps(coco, sort_keys=True).encode(), lambda f: images[f], None)


@torch.no_grad()
def validate(model, vset: ValidationSet, prompts: tuple[str, ...] = ("point",)) -> dict[str, dict]:
    """mIoU vs ground truth at full resolution, per prompt kind: one prompt per object (the
    centre point, or the tight box), keeping the output with the highest predicted IoU, as the
    published evaluation. Each image is embedded once (SamPredictor.set_torch_image) and all its
    prompts of a kind decode in one SamPredictor.predict_torch call."""
    was_training = model.training
    model.eval()
    predictor = SamPredictor(model)
    records: dict[str, list] = {kind: [] for kind in prompts}
    for sample, image in zip(vset.samples, vset.input_images(model.device)):
        predictor.set_torch_image(image, sample.image.shape[:2])
        for kind in prompts:
            p = prompts_for(sample, kind)
            if kind == "point":
                coords = _to_input_frame(p.point_coords, predictor)
                labels = torch.ones(coords.shape[:2], dtype=torch.int, device=coords.device)
                masks, scores, _ = predictor.predict_torch(coords, labels)
            else:
                boxes = _to_input_frame(p.boxes.reshape(-1, 2, 2), predictor).reshape(-1, 4)
                masks, scores, _ = predictor.predict_torch(None, None, boxes)
            best = scores.float().argmax(dim=1)
            masks = masks[torch.arange(len(best), device=best.device), best].cpu().numpy()
            records[kind] += [(a.category_id, mask_iou(m, a.mask)) for a, m in zip(sample.annotations, masks)]
    model.train(was_training)
    out = {}
    for kind, recs in records.items():
        summary = miou_vs_ground_truth(recs)
        out[kind] = {"miou": round(summary["mean"], 4), "count": summary["count"]}
    return out


def _to_input_frame(coords: np.ndarray, predictor: SamPredictor) -> torch.Tensor:
    scaled = scale_coords(coords, predictor.original_size, predictor.long_side)
    return torch.as_tensor(scaled, dtype=torch.float, device=predictor.device)
