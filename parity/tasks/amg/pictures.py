"""Segment everything's picture of one image: the whole image, each matched golden/stage pair in one
colour of its own, a golden mask with no match (lost) and a stage mask with no match (new) in plain red.

    png = amg_comparison_png(image, golden_masks, stage_masks, pairs, title="image 3: 2 lost")
"""

from __future__ import annotations

import numpy as np

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
