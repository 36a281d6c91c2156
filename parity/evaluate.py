"""Run one model stage over a dataset: every annotation's prompt through the batched predictor.

The golden writer and the checker both call `evaluate`, so the golden and each stage see the
same images, prompts, batching and post-processing; only the model differs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from pycocotools import mask as mask_utils
from tqdm import tqdm

from parity.data import Dataset
from parity.metrics import mask_iou
from samfast import Prompts, SamPredictor

LOGITS_SUBSET = 8  # annotations whose low-res logits are kept (fp16, 3 x 256 x 256 each): bounds golden size
PROMPT_KINDS = ("point", "box")


@dataclass
class AnnotationOutput:
    ann_id: int
    image_id: int
    category_id: int
    scores: list[float]  # predicted IoU of the three multimask outputs
    best: int  # index of the highest predicted IoU: the mask the published evaluation keeps
    rles: list[dict]  # the three masks, pycocotools RLE with str counts
    gt_iou: float  # IoU of the best mask with the ground truth


@dataclass
class StageOutputs:
    annotations: list[AnnotationOutput]
    logits: dict[int, np.ndarray]  # ann_id -> (3, 256, 256) float32, for the first LOGITS_SUBSET annotations
    images: int
    seconds: float  # wall time of the whole run
    first_batch_images: int
    first_batch_seconds: float  # includes compilation and autotuning

    @property
    def steady_img_s(self) -> float | None:
        """Images per second after the first batch (None when there was only one batch)."""
        rest = self.seconds - self.first_batch_seconds
        return (self.images - self.first_batch_images) / rest if self.images > self.first_batch_images else None


def prompts_for(sample, prompt: str) -> Prompts:
    if prompt == "point":
        points = np.array([[a.point] for a in sample.annotations], dtype=float)
        return Prompts(point_coords=points, point_labels=np.ones(points.shape[:2]))
    return Prompts(boxes=np.array([a.box for a in sample.annotations], dtype=float))


def encode_rle(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}


def decode_rle(rle: dict) -> np.ndarray:
    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode("ascii")}).astype(bool)


@torch.no_grad()
def evaluate(model, dataset: Dataset, *, prompt: str = "point", batch_size: int = 8, desc: str = "") -> StageOutputs:
    if prompt not in PROMPT_KINDS:
        raise ValueError(f"prompt must be one of {PROMPT_KINDS}, got {prompt!r}")
    predictor = SamPredictor(model)
    indices = list(range(len(dataset.samples)))
    outputs, logits = [], {}
    start = time.perf_counter()
    first_batch_seconds = 0.0
    first_batch_images = images = 0
    with tqdm(total=dataset.num_annotations, desc=desc or "evaluate", unit="ann", leave=False) as bar:
        for first in range(0, len(indices), batch_size):
            samples = [s for s in (dataset.samples[i] for i in indices[first : first + batch_size]) if s.annotations]
            if not samples:
                continue
            predictions = predictor.predict_batch([s.image for s in samples], [prompts_for(s, prompt) for s in samples])
            for sample, pred in zip(samples, predictions):
                scores = pred.iou_predictions.float().cpu().numpy()
                masks = pred.masks.cpu().numpy()
                for j, ann in enumerate(sample.annotations):
                    best = int(np.argmax(scores[j]))
                    outputs.append(
                        AnnotationOutput(
                            ann.ann_id, ann.image_id, ann.category_id, scores[j].tolist(), best,
                            [encode_rle(m) for m in masks[j]], mask_iou(masks[j][best], ann.mask),
                        )
                    )
                    if len(logits) < LOGITS_SUBSET:
                        logits[ann.ann_id] = pred.low_res_logits[j].float().cpu().numpy()
                bar.update(len(sample.annotations))
            images += len(samples)
            if not first_batch_images:
                first_batch_images, first_batch_seconds = images, time.perf_counter() - start
    return StageOutputs(outputs, logits, images, time.perf_counter() - start, first_batch_images, first_batch_seconds)
