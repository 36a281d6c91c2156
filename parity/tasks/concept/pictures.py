"""The concept task's picture of one (image, phrase): the image, the golden's detections, the stage's (a pair
of the same query shares a colour; lost and new are red) and the difference of their unions
(parity.report.pictures.paired_masks_png); and those of a failed or near-failing stage's
worst pairs (worst_pictures), keyed by their rank among the worst."""

from __future__ import annotations

from parity.compare.gates import StageResult
from parity.golden.data import Dataset
from parity.golden.rle import decode_rle
from parity.report.pictures import paired_masks_png


def _detections(pairs: list[dict], phrase: str) -> list[dict]:
    return next(pair["detections"] for pair in pairs if pair["phrase"] == phrase)


def worst_pictures(result: StageResult, dataset: Dataset, golden: dict[int, list[dict]],
                   stage: dict[int, list[dict]]) -> dict[int, bytes]:
    """rank -> PNG of the golden's and the stage's detections of each of the stage's worst pairs."""
    pictures = {}
    for rank, w in enumerate(result.worst):
        image_id, phrase = w["image_id"], w["phrase"]
        image = dataset.samples[dataset.samples.image_ids.index(image_id)].image  # read only the worst images
        gold, ours = _detections(golden[image_id], phrase), _detections(stage[image_id], phrase)
        golden_index = {d["query"]: i for i, d in enumerate(gold)}
        stage_index = {d["query"]: i for i, d in enumerate(ours)}
        title = (f"image {image_id}, {phrase!r}: union IoU {w['union_iou_mean']:.3f}, {w['golden_detections']} golden / "
                 f"{w['stage_detections']} stage detections, {w['lost']} lost, {w['new']} new")
        pictures[rank] = paired_masks_png(
            image, [decode_rle(d["segmentation"]) for d in gold], [decode_rle(d["segmentation"]) for d in ours],
            [(golden_index[q], stage_index[q]) for q, _ in w["matched"]], title)
    return pictures
