"""Segment everything's picture of one image: the whole image, each matched golden/stage pair in one
colour of its own, a golden mask with no match (lost) and a stage mask with no match (new) in plain red;
and those pictures of a failed or near-failing stage's worst images (worst_pictures).

    png = amg_comparison_png(image, golden_masks, stage_masks, pairs, title="image 3: 2 lost")
"""

from __future__ import annotations

import numpy as np

from parity.compare.gates import StageResult
from parity.golden.data import Dataset
from parity.golden.rle import decode_rle
from parity.report.pictures import as_rgb, difference, panel_sheet, png_bytes

# Matched AMG pairs, one colour each (a pair shares its colour), none of them near UNMATCHED's red.
PALETTE = [(60, 120, 255), (0, 200, 200), (250, 220, 40), (170, 80, 220), (120, 200, 60), (230, 230, 230),
           (20, 90, 60)]


UNMATCHED = (230, 40, 40)


def _paint(rgb: np.ndarray, masks: list[np.ndarray], colors: list[tuple]) -> np.ndarray:
    out = rgb.astype(np.float32) * 0.45
    for mask, color in zip(masks, colors):  # stronger than _tint: the colours tell the masks apart
        out[mask] = 0.2 * rgb[mask] + 0.8 * np.asarray(color, np.float32)
    return out.astype(np.uint8)


def amg_comparison_png(image: np.ndarray, golden: list[np.ndarray], stage: list[np.ndarray],
                       pairs: list[tuple[int, int]], title: str = "") -> bytes:
    """PNG bytes: image | the golden's masks | the stage's masks | difference of their unions, under `title`.

    pairs: (golden index, stage index) of matched masks; each pair gets a colour of its own, masks
    without a match are red in their panel.
    """
    rgb = as_rgb(image)
    if any(m.shape != rgb.shape[:2] for m in [*golden, *stage]):
        raise ValueError(f"every mask must have the image's size {rgb.shape[:2]}")
    golden_colors, stage_colors = [UNMATCHED] * len(golden), [UNMATCHED] * len(stage)
    for n, (g, s) in enumerate(pairs):
        golden_colors[g] = stage_colors[s] = PALETTE[n % len(PALETTE)]
    empty = np.zeros(rgb.shape[:2], bool)
    panels = [rgb, _paint(rgb, golden, golden_colors), _paint(rgb, stage, stage_colors),
              difference(rgb, np.logical_or.reduce([empty, *golden]), np.logical_or.reduce([empty, *stage]))]
    labels = ("image", "golden (red: lost)", "stage (red: new)", "diff: green golden, red stage")
    return png_bytes(panel_sheet(panels, labels, title)[0])


def worst_pictures(result: StageResult, dataset: Dataset, golden: dict[int, list[dict]],
                   stage: dict[int, list[dict]]) -> dict[int, bytes]:
    """image id -> PNG of the golden's and the stage's masks on the image, for each of the stage's worst images."""
    pictures = {}
    for w in result.worst:
        image_id = w["image_id"]
        image = dataset.samples[dataset.samples.image_ids.index(image_id)].image  # read only the worst images
        title = (f"image {image_id}: union IoU {w['union_iou_mean']:.3f}, {w['golden_masks']} golden / "
                 f"{w['stage_masks']} stage masks, {w['lost']} lost, {w['new']} new")
        pictures[image_id] = amg_comparison_png(
            image, [decode_rle(r["segmentation"]) for r in golden[image_id]],
            [decode_rle(r["segmentation"]) for r in stage[image_id]], [(g, s) for g, s, _ in w["pairs"]], title)
    return pictures
