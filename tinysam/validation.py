"""Validation: the published evaluation (one centre point or tight box per object, the output with
the highest predicted IoU, mIoU vs ground truth at full resolution) through samfast.SamPredictor
(for a SAM 2 model, its SAM 2 predictor), on the gate's own data path, prompts and metrics, so a
checkpoint is measured as the gate measures it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from parity.compare.metrics import mask_iou, miou_vs_ground_truth
from parity.golden.data import index_dataset
from parity.golden.scenes import generate_scenes
from parity.tasks.point.produce import prompts_for
from samfast import SamPredictor
from tinysam.frames import LONGEST_SIDE

HELDOUT_SEED, HELDOUT_IMAGES = 999, 64  # generate_scenes seed and size of the held-out set (never trained on)


@dataclass
class ValidationSet:
    """Samples with at least one object, and their inputs to the predictor in the model's input
    frame (tinysam.frames), made once per device."""

    name: str
    samples: list
    frame: object = LONGEST_SIDE
    inputs: list | None = None
    inputs_device: torch.device | None = None

    @classmethod
    def of(cls, name: str, dataset, frame=LONGEST_SIDE) -> ValidationSet:
        return cls(name, [s for s in dataset.samples if s.annotations], frame)

    def input_images(self, device: torch.device) -> list:
        """Each sample's image as the frame's set_image takes it (SAM 1: a resized (1, 3, h, w)
        uint8 tensor on the device, as SamPredictor.set_image resizes)."""
        if self.inputs is None or self.inputs_device != device:
            self.inputs = [self.frame.validation_input(s.image, device) for s in self.samples]
            self.inputs_device = device
        return self.inputs


def heldout_dataset(num_images: int = HELDOUT_IMAGES, seed: int = HELDOUT_SEED):
    """generate_scenes(num_images, seed) through parity.golden.data's one loading path (prompts, skips)."""
    coco, images = generate_scenes(num_images, seed=seed)
    return index_dataset(f"scenes-seed{seed}", json.dumps(coco, sort_keys=True).encode(), lambda f: images[f], None)


@torch.no_grad()
def validate(model, vset: ValidationSet, prompts: tuple[str, ...] = ("point",)) -> dict[str, dict]:
    """mIoU vs ground truth at full resolution, per prompt kind: one prompt per object (the
    centre point, or the tight box), keeping the output with the highest predicted IoU, as the
    published evaluation. Each image is embedded once (the frame's set_image) and all its
    prompts of a kind decode in one SamPredictor.predict_torch call."""
    was_training = model.training
    model.eval()
    predictor = SamPredictor(model)
    records: dict[str, list] = {kind: [] for kind in prompts}
    frame = vset.frame
    for sample, image in zip(vset.samples, vset.input_images(model.device)):
        size = sample.image.shape[:2]
        frame.set_image(predictor, image, size)
        for kind in prompts:
            p = prompts_for(sample, kind)
            if kind == "point":
                coords = _in_frame(frame, p.point_coords, size, model.device)
                labels = torch.ones(coords.shape[:2], dtype=torch.int, device=coords.device)
                masks, scores, _ = predictor.predict_torch(coords, labels)
            else:
                boxes = _in_frame(frame, p.boxes.reshape(-1, 2, 2), size, model.device).reshape(-1, 4)
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


def _in_frame(frame, coords: np.ndarray, original_size: tuple[int, int], device: torch.device) -> torch.Tensor:
    """Prompt coordinates (pixels of the original image) in the model's input frame, as predict_torch takes them."""
    return torch.as_tensor(frame.to_input_frame(coords, original_size), dtype=torch.float, device=device)
