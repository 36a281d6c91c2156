"""One picture of a disagreement between golden and stage masks: what a reviewer looks at instead of ids.

    png = mask_comparison_png(image, golden_mask, stage_mask, point=(x, y), title="ann 17: IoU 0.41")

Four panels: the image (a crop around both masks, with the prompt), the golden mask, the stage's
mask, and their difference (green: golden only, red: stage only, white: both). The panel sheet,
difference and PNG helpers serve every task's pictures; paired_masks_png draws many masks of each side, paired
(segment everything's and the concept task's).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageFont

PANEL = 200  # pixels per panel side
LABEL_HEIGHT = 18
GOLDEN_ONLY, STAGE_ONLY, BOTH = (40, 200, 60), (230, 40, 40), (255, 255, 255)
PROMPT_COLOR = (255, 215, 0)


def crop_box(masks: list[np.ndarray], point=None, margin: float = 0.25, min_side: int = 32) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) around the union of the masks and the point, padded by `margin` of its size."""
    h, w = masks[0].shape
    ys, xs = np.nonzero(np.logical_or.reduce(masks))
    if point is not None:
        xs, ys = np.append(xs, int(point[0])), np.append(ys, int(point[1]))
    if xs.size == 0:
        return 0, 0, w, h
    x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
    pad_x = max(int((x1 - x0) * margin), (min_side - (x1 - x0)) // 2, 0)
    pad_y = max(int((y1 - y0) * margin), (min_side - (y1 - y0)) // 2, 0)
    return max(x0 - pad_x, 0), max(y0 - pad_y, 0), min(x1 + pad_x, w), min(y1 + pad_y, h)


def _tint(rgb: np.ndarray, mask: np.ndarray, color) -> np.ndarray:
    out = rgb.astype(np.float32) * 0.45  # dim the image so the mask stands out
    out[mask] = 0.4 * rgb[mask] + 0.6 * np.asarray(color, np.float32)
    return out.astype(np.uint8)


def difference(rgb: np.ndarray, golden: np.ndarray, stage: np.ndarray) -> np.ndarray:
    out = (rgb.astype(np.float32) * 0.25).astype(np.uint8)
    out[golden & stage] = BOTH
    out[golden & ~stage] = GOLDEN_ONLY
    out[stage & ~golden] = STAGE_ONLY
    return out


def panel_sheet(panels: list[np.ndarray], labels: tuple[str, ...], title: str):
    """The panels side by side under their labels and a title: (sheet, draw, scale, inset, top), where a
    panel pixel (x, y) lands at (left + inset + x * scale, top + y * scale)."""
    h, w = panels[0].shape[:2]
    scale = PANEL / max(w, h)
    size = (max(round(w * scale), 1), max(round(h * scale), 1))
    inset = (PANEL - size[0]) // 2  # a tall picture is centred in its panel
    font = ImageFont.load_default(size=13)
    title_height = LABEL_HEIGHT if title else 0
    sheet = Image.new("RGB", (len(panels) * (PANEL + 4) - 4, title_height + LABEL_HEIGHT + size[1]), (250, 250, 250))
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((2, 1), title, fill=(0, 0, 0), font=font)
    for i, (panel, label) in enumerate(zip(panels, labels)):
        left = i * (PANEL + 4)
        draw.text((left + 2, title_height + 2), label, fill=(40, 40, 40), font=font)
        resample = Image.Resampling.NEAREST if i == len(panels) - 1 else Image.Resampling.BILINEAR  # crisp differences
        sheet.paste(Image.fromarray(panel).resize(size, resample), (left + inset, title_height + LABEL_HEIGHT))
    return sheet, draw, scale, inset, title_height + LABEL_HEIGHT


def png_bytes(sheet: Image.Image) -> bytes:
    buffer = io.BytesIO()
    sheet.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def as_rgb(image: np.ndarray) -> np.ndarray:
    return np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else np.asarray(image)[..., :3]


def mask_comparison_png(image: np.ndarray, golden: np.ndarray, stage: np.ndarray, *, point=None, box=None,
                        title: str = "", image_label: str = "image + prompt") -> bytes:
    """PNG bytes: image crop with the prompt | golden mask | stage mask | difference, under `title`.

    image: HxW or HxWx3 uint8; golden, stage: HxW bool; point (x, y) and box (x0, y0, x1, y1) in pixels.
    """
    golden, stage = np.asarray(golden, bool), np.asarray(stage, bool)
    rgb = as_rgb(image)
    if not (rgb.shape[:2] == golden.shape == stage.shape):
        raise ValueError(f"image {rgb.shape[:2]}, golden mask {golden.shape} and stage mask {stage.shape} differ in size")
    x0, y0, x1, y1 = crop_box([golden, stage], point)
    crop = (slice(y0, y1), slice(x0, x1))
    panels = [rgb[crop], _tint(rgb[crop], golden[crop], (60, 120, 255)), _tint(rgb[crop], stage[crop], (255, 140, 0)),
              difference(rgb[crop], golden[crop], stage[crop])]
    sheet, draw, scale, inset, top = panel_sheet(panels, (image_label, "golden", "stage", "diff: green golden, red stage"), title)
    for left in range(0, 4 * (PANEL + 4), PANEL + 4):  # the prompt on every panel

        def to_sheet(x, y):
            return left + inset + (x - x0) * scale, top + (y - y0) * scale

        if box is not None:
            draw.rectangle([*to_sheet(box[0], box[1]), *to_sheet(box[2], box[3])], outline=PROMPT_COLOR, width=2)
        if point is not None:
            px, py = to_sheet(point[0] + 0.5, point[1] + 0.5)  # the centre of the prompt's pixel
            draw.ellipse([px - 5, py - 5, px + 5, py + 5], fill=PROMPT_COLOR, outline=(0, 0, 0), width=2)
    return png_bytes(sheet)


# Matched pairs (segment everything's masks, the concept task's detections), one colour each (a pair shares
# its colour), none of them near UNMATCHED's red.
PALETTE = [(60, 120, 255), (0, 200, 200), (250, 220, 40), (170, 80, 220), (120, 200, 60), (230, 230, 230),
           (20, 90, 60)]
UNMATCHED = (230, 40, 40)


def _paint(rgb: np.ndarray, masks: list[np.ndarray], colors: list[tuple]) -> np.ndarray:
    out = rgb.astype(np.float32) * 0.45
    for mask, color in zip(masks, colors):  # stronger than _tint: the colours tell the masks apart
        out[mask] = 0.2 * rgb[mask] + 0.8 * np.asarray(color, np.float32)
    return out.astype(np.uint8)


def paired_masks_png(image: np.ndarray, golden: list[np.ndarray], stage: list[np.ndarray],
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
