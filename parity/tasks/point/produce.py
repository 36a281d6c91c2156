"""Run one model stage over a dataset: every annotation's prompt through the batched predictor.

The golden writer and the checker both call `evaluate`, so the golden and each stage see the
same images, prompts, batching and post-processing; only the model differs. Under torchrun the
batches are shared among ranks (parity.golden.distributed); every batch's result reaches the assembler
as the bytes of its record, whether computed now, on another rank, or by a run that was killed.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from parity.compare.metrics import mask_iou
from parity.golden.data import DataError, Dataset
from parity.golden.distributed import SINGLE_PROCESS, Ranks, WorkFolder, failure, raise_first_failure
from parity.golden.rle import encode_rle
from samfast import InputError, Prompts, SamPredictor

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


class BadSample(ValueError):
    """An image (or its annotations) that cannot be read: bad input, not a failed stage."""


@dataclass
class BatchOutputs:
    """One batch of images (the single-process batches of --batch-size consecutive images)."""

    batch: int
    images: int  # images with annotations: those the model saw
    seconds: float
    annotations: list[AnnotationOutput]
    logits: dict[int, np.ndarray]  # ann_id -> (3, 256, 256) float32

    def to_bytes(self) -> bytes:
        """A JSON header line, a JSON line of annotations, then the logits as raw float32 (exact)."""
        header = {"batch": self.batch, "images": self.images, "seconds": self.seconds,
                  "logits": [[ann_id, list(l.shape)] for ann_id, l in self.logits.items()]}
        raw = b"".join(np.ascontiguousarray(l, dtype="<f4").tobytes() for l in self.logits.values())
        return b"\n".join([json.dumps(header).encode(), json.dumps([asdict(a) for a in self.annotations]).encode(), raw])

    @classmethod
    def from_bytes(cls, payload: bytes) -> BatchOutputs:
        header, annotations, raw = payload.split(b"\n", 2)
        header = json.loads(header)
        logits, offset = {}, 0
        for ann_id, shape in header["logits"]:
            count = math.prod(shape)
            logits[ann_id] = np.frombuffer(raw, "<f4", count, offset).reshape(shape).astype(np.float32)
            offset += 4 * count
        return cls(header["batch"], header["images"], header["seconds"],
                   [AnnotationOutput(**a) for a in json.loads(annotations)], logits)


@dataclass
class StageOutputs:
    annotations: list[AnnotationOutput]
    logits: dict[int, np.ndarray]  # ann_id -> (3, 256, 256) float32, for the first LOGITS_SUBSET annotations
    images: int  # computed by this run (a resumed run leaves out what it found done)
    seconds: float  # wall time of the whole run
    first_batch_images: int  # images of the first round (one batch per rank) computed by this run
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


def image_batches(num_images: int, batch_size: int) -> list[range]:
    """The batches of one process: batch_size consecutive images in dataset order."""
    if batch_size < 1:
        raise InputError(f"batch size must be at least 1, got {batch_size}")
    return [range(first, min(first + batch_size, num_images)) for first in range(0, num_images, batch_size)]


def evaluate_batch(predictor: SamPredictor, dataset: Dataset, batch: int, images: range, prompt: str,
                   keep_logits: int) -> BatchOutputs:
    """One batch through the predictor; the low-res logits of its first keep_logits annotations kept."""
    start = time.perf_counter()
    samples = []
    for i in images:
        try:
            sample = dataset.samples[i]
        except DataError as err:  # an unreadable image: bad input on this rank (a loader bug keeps its traceback)
            image_id, file_name = dataset.samples.image_ids[i], dataset.samples.file_names[i]
            raise BadSample(f"image id {image_id} ({file_name}): {type(err).__name__}: {err}") from err
        if sample.annotations:
            samples.append(sample)
    outputs, logits = [], {}
    if samples:
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
                if len(logits) < keep_logits:
                    logits[ann.ann_id] = pred.low_res_logits[j].float().cpu().numpy()
    return BatchOutputs(batch, len(samples), time.perf_counter() - start, outputs, logits)


@torch.no_grad()
def evaluate(model, dataset: Dataset, *, prompt: str = "point", batch_size: int = 8, desc: str = "",
             ranks: Ranks = SINGLE_PROCESS, work: WorkFolder | None = None) -> StageOutputs | None:
    """The stage's outputs over the dataset on rank 0 (None on other ranks), in dataset order.

    Batch k runs on rank k % world_size unless `work` already holds it; any rank's failure raises
    RankFailure on every rank at the next round boundary.
    """
    if prompt not in PROMPT_KINDS:
        raise ValueError(f"prompt must be one of {PROMPT_KINDS}, got {prompt!r}")
    predictor = SamPredictor(model)
    batches = image_batches(len(dataset.samples), batch_size)
    counts = dataset.samples.annotation_counts
    finished = work.open() if work else {}
    # The golden keeps the logits of the first LOGITS_SUBSET annotations in dataset order.
    before = np.cumsum([0] + [sum(counts[i] for i in images) for images in batches])
    done: dict[int, BatchOutputs] = {}
    if ranks.is_main:
        done = {k: BatchOutputs.from_bytes(p) for k, p in finished.items()}
        print(f"{desc or 'evaluate'}: {ranks.world_size} rank{'s share' if ranks.world_size > 1 else ' runs'} "
              f"{len(batches)} batches of {batch_size} image(s)"
              + (f"; {len(finished)} batches already done in {work.path}, resuming" if finished else ""),
              file=sys.stderr, flush=True)
    start = time.perf_counter()
    first_round_images, first_round_seconds = 0, 0.0
    with tqdm(total=len(dataset.samples), initial=sum(len(batches[k]) for k in finished), desc=desc or "evaluate",
              unit="img", leave=False, disable=not ranks.is_main) as bar:
        for first in range(0, len(batches), ranks.world_size):
            batch = first + ranks.rank
            payload = problem = None
            if batch < len(batches) and batch not in finished:
                keep = max(0, LOGITS_SUBSET - int(before[batch]))
                payload, problem = _own_batch(predictor, dataset, batch, batches[batch], prompt, keep, ranks, work)
            exchanged = ranks.all_gather((payload, problem))
            raise_first_failure([p for _, p in exchanged])
            if not ranks.is_main:
                continue
            computed = [BatchOutputs.from_bytes(p) for p, _ in exchanged if p is not None]
            done.update((b.batch, b) for b in computed)
            bar.update(sum(len(batches[b.batch]) for b in computed))
            if computed and not first_round_images:
                first_round_images = sum(b.images for b in computed)
                first_round_seconds = time.perf_counter() - start
    if not ranks.is_main:
        return None
    seconds = time.perf_counter() - start
    images_run = sum(len(batches[k]) for k in range(len(batches)) if k not in finished)
    # The tqdm line goes away with the bar: this one stays, for scaling measurements (docs/scale.md).
    print(f"{desc or 'evaluate'}: {images_run} images in {seconds:.1f} s ({images_run / seconds:.2f} img/s) "
          f"on {ranks.world_size} rank(s)", file=sys.stderr, flush=True)
    ordered = [done[k] for k in range(len(batches))]
    logits = {ann_id: l for b in ordered for ann_id, l in b.logits.items()}
    return StageOutputs([a for b in ordered for a in b.annotations], logits,
                        sum(b.images for b in ordered if b.batch not in finished), seconds,
                        first_round_images, first_round_seconds)


def _own_batch(predictor, dataset: Dataset, batch: int, images: range, prompt: str, keep_logits: int,
               ranks: Ranks, work: WorkFolder | None) -> tuple[bytes | None, dict | None]:
    """This rank's batch as (record bytes, None), kept in `work` first; or (None, what went wrong)."""
    try:
        payload = evaluate_batch(predictor, dataset, batch, images, prompt, keep_logits).to_bytes()
    except BadSample as err:
        return None, failure(ranks, str(err), bad_input=True)
    except Exception as err:  # out of memory, a kernel that cannot run: the stage failed
        ids = ", ".join(str(dataset.samples.image_ids[i]) for i in images)
        return None, failure(ranks, f"batch {batch} (image ids {ids}): {type(err).__name__}: {err}", bad_input=False)
    if work:
        work.append(payload)
    return payload, None
