"""Run SAM 3's processor over a dataset: every category name as a phrase on every image, each pair's
detections above the confidence threshold made JSON-ready."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from parity.golden.data import Dataset
from parity.golden.rle import encode_rle
from samfast.sam3 import Sam3Processor

# What the golden keeps of each detection. The query is its identity: query q of any stage answers the
# question query q of the golden answered, so detections are paired by it (parity.tasks.concept.compare).
# Beside them each pair keeps every query's score, kept or not: what decided each count.
DETECTION_KEYS = ("query", "score", "box", "segmentation")
PAIR_KEYS = ("phrase", "presence", "query_scores", "detections")
# Every switch SAM 3 builds reaches predict_batch's one call; none is ignored.
IGNORED_SWITCHES: dict[str, str] = {}


def phrases_of(dataset: Dataset) -> list[str]:
    """The phrases asked of every image: the dataset's category names in id order, so an image is asked for
    concepts it holds and for concepts it lacks (the negatives that image-level presence is judged on)."""
    return [dataset.categories[c] for c in sorted(dataset.categories)]


@dataclass(frozen=True)
class Detected:
    # image id -> one entry per phrase (in phrases' order): {"phrase", "presence", "detections": [...]}
    images: dict[int, list[dict]]
    described: dict[int, dict]  # image id -> file_name, height, width
    seconds: float

    @property
    def ms_per_image(self) -> float:
        return 1000.0 * self.seconds / max(len(self.images), 1)


def plain_pair(phrase: str, result: dict) -> dict:
    """One (image, phrase) result of Sam3Processor.predict_batch as plain JSON values."""
    masks = result["masks"].squeeze(1).cpu().numpy()
    return {
        "phrase": phrase,
        "presence": float(result["presence_score"]),
        "query_scores": result["query_scores"].tolist(),
        "detections": [
            {"query": int(q), "score": float(s), "box": [float(v) for v in box], "segmentation": encode_rle(mask)}
            for q, s, box, mask in zip(result["query_indices"].tolist(), result["scores"].tolist(),
                                       result["boxes"].tolist(), masks)
        ],
    }


def detect(model: torch.nn.Module, dataset: Dataset, phrases: list[str], confidence_threshold: float,
           desc: str) -> Detected:
    """Every phrase on every image of `dataset` through one predict_batch call per image, no image skipped."""
    processor = Sam3Processor(model, resolution=model.backbone.vision_backbone.trunk.img_size,
                              confidence_threshold=confidence_threshold)
    images, described, seconds = {}, {}, 0.0
    for sample in tqdm(dataset.samples, desc=desc, unit="img"):
        start = time.perf_counter()
        (results,) = processor.predict_batch([np.ascontiguousarray(sample.image)], phrases)
        images[sample.image_id] = [plain_pair(phrase, result) for phrase, result in zip(phrases, results)]
        seconds += time.perf_counter() - start
        height, width = sample.image.shape[:2]
        described[sample.image_id] = {"file_name": sample.file_name, "height": height, "width": width}
    return Detected(images, described, seconds)
