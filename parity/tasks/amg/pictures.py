"""Segment everything's picture of one image: the whole image, each matched golden/stage pair in one
colour of its own, a golden mask with no match (lost) and a stage mask with no match (new) in plain red;
and those pictures of a failed or near-failing stage's worst images (worst_pictures).

    png = paired_masks_png(image, golden_masks, stage_masks, pairs, title="image 3: 2 lost")
"""

from __future__ import annotations

from parity.compare.gates import StageResult
from parity.golden.data import Dataset
from parity.golden.rle import decode_rle
from parity.report.pictures import paired_masks_png


def worst_pictures(result: StageResult, dataset: Dataset, golden: dict[int, list[dict]],
                   stage: dict[int, list[dict]]) -> dict[int, bytes]:
    """image id -> PNG of the golden's and the stage's masks on the image, for each of the stage's worst images."""
    pictures = {}
    for w in result.worst:
        image_id = w["image_id"]
        image = dataset.samples[dataset.samples.image_ids.index(image_id)].image  # read only the worst images
        title = (f"image {image_id}: union IoU {w['union_iou_mean']:.3f}, {w['golden_masks']} golden / "
                 f"{w['stage_masks']} stage masks, {w['lost']} lost, {w['new']} new")
        pictures[image_id] = paired_masks_png(
            image, [decode_rle(r["segmentation"]) for r in golden[image_id]],
            [decode_rle(r["segmentation"]) for r in stage[image_id]], [(g, s) for g, s, _ in w["pairs"]], title)
    return pictures
