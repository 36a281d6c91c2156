"""Run a mask generator over a dataset: the generator's parameters, and its records made JSON-ready."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch
from tqdm import tqdm

from parity.golden.data import Dataset
from parity.tasks.amg.alternates import alternates_generator
from samfast import SamAutomaticMaskGenerator

# What the golden keeps of each record: every key of the reference generator's records.
RECORD_KEYS = ("segmentation", "area", "bbox", "predicted_iou", "stability_score", "point_coords", "crop_box")
# The switches the generator never reads, and why: "not applicable" to this task (parity.checks.exercised).
IGNORED_SWITCHES = {"nt": "the generator decodes one image at a time"}


@dataclass(frozen=True)
class AmgParams:
    """The generator parameters that decide which masks come out (the reference's defaults).

    A golden records them and is refused for a check run with others. points_per_batch is not
    here: it only splits the same work into decoder calls, so it must not change the answer.
    """

    points_per_side: int = 32
    pred_iou_thresh: float = 0.88
    stability_score_thresh: float = 0.95
    stability_score_offset: float = 1.0
    box_nms_thresh: float = 0.7
    crop_n_layers: int = 0
    crop_nms_thresh: float = 0.7
    crop_overlap_ratio: float = 512 / 1500
    crop_n_points_downscale_factor: int = 1
    min_mask_region_area: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    def cli_args(self) -> str:
        """The flags that give these parameters (only those that differ from the defaults)."""
        default = AmgParams()
        return " ".join(f"--{f.name.replace('_', '-')} {getattr(self, f.name)}" for f in fields(self)
                        if getattr(self, f.name) != getattr(default, f.name))


def make_generator(model: torch.nn.Module, params: AmgParams, points_per_batch: int,
                   alternates_within: float | None = None) -> SamAutomaticMaskGenerator:
    """samfast's generator for `model`, with COCO RLE output (what the golden stores and matching reads);
    with alternates_within (a score tolerance), one that also keeps the masks NMS dropped at a near tie
    (parity.tasks.amg.alternates)."""
    settings = dict(points_per_batch=points_per_batch, output_mode="coco_rle", **params.as_dict())
    if alternates_within is None:
        return SamAutomaticMaskGenerator(model, **settings)
    return alternates_generator(model, alternates_within, **settings)


def plain_record(record: dict) -> dict:
    """The record's RECORD_KEYS as plain JSON values (numpy and tensor scalars become floats and ints)."""
    rle = record["segmentation"]
    counts = rle["counts"].decode("ascii") if isinstance(rle["counts"], bytes) else rle["counts"]
    return {
        "segmentation": {"size": [int(v) for v in rle["size"]], "counts": counts},
        "area": int(record["area"]),
        "bbox": [float(v) for v in np.asarray(record["bbox"]).ravel()],
        "predicted_iou": float(record["predicted_iou"]),
        "stability_score": float(record["stability_score"]),
        "point_coords": [[float(v) for v in point] for point in np.asarray(record["point_coords"]).reshape(-1, 2)],
        "crop_box": [int(v) for v in np.asarray(record["crop_box"]).ravel()],
    }


@dataclass(frozen=True)
class Generated:
    images: dict[int, list[dict]]  # image id -> plain records
    described: dict[int, dict]  # image id -> file_name, height, width
    seconds: float
    alternates: dict[int, list[dict]] = field(default_factory=dict)  # image id -> plain records, if kept

    @property
    def ms_per_image(self) -> float:
        return 1000.0 * self.seconds / max(len(self.images), 1)


def generate(generator: SamAutomaticMaskGenerator, dataset: Dataset, desc: str) -> Generated:
    """Every image of `dataset` through `generator.generate`, no image skipped (and the alternates of a
    generator that keeps them)."""
    images, described, alternates, seconds = {}, {}, {}, 0.0
    for sample in tqdm(dataset.samples, desc=desc, unit="img"):
        start = time.perf_counter()
        records = generator.generate(sample.image)
        seconds += time.perf_counter() - start
        images[sample.image_id] = [plain_record(r) for r in records]
        if hasattr(generator, "alternates"):
            (kept,) = generator.alternates
            alternates[sample.image_id] = [plain_record(r) for r in kept]
        height, width = sample.image.shape[:2]
        described[sample.image_id] = {"file_name": sample.file_name, "height": height, "width": width}
    return Generated(images, described, seconds, alternates)
