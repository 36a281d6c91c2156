"""The point task's pictures: each of a failed or near-failing stage's worst annotations on its image."""

from __future__ import annotations

from parity.compare.gates import StageResult
from parity.golden.data import Dataset
from parity.golden.rle import decode_rle
from parity.report.pictures import mask_comparison_png


def worst_pictures(result: StageResult, dataset: Dataset, prompt: str) -> dict[int, bytes]:
    """ann_id -> PNG of the golden and the stage's mask on the image, for each of the stage's worst annotations."""
    pictures = {}
    for w in result.worst:
        sample = dataset.samples[dataset.samples.image_ids.index(w["image_id"])]
        ann = next(a for a in sample.annotations if a.ann_id == w["ann_id"])
        golden_rle, stage_rle = result.worst_masks[w["ann_id"]]
        title = (f"annotation {w['ann_id']} (image {w['image_id']}): IoU vs golden "
                 f"{w['iou_vs_golden']:.3f}, mask {w['best']} / golden {w['golden_best']}"
                 + (" (near tie)" if w["near_tie"] else ""))
        pictures[w["ann_id"]] = mask_comparison_png(
            sample.image, decode_rle(golden_rle), decode_rle(stage_rle), title=title,
            point=ann.point if prompt == "point" else None, box=ann.box if prompt == "box" else None)
    return pictures
