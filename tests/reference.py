"""How samfast's answers are compared with segment_anything's (the reference models themselves:
parity.reference): the prompts both get and the tolerance their outputs meet."""

from __future__ import annotations

import numpy as np

from tests.masks import assert_masks_equal_away_from_threshold

LOGITS_ATOL = 1e-4  # fp32 rounding: the two differ only in the order of a few additions


def prompt_cases(h: int, w: int) -> list[dict]:
    """Point, multi-point with a background click, and box prompts, multimask on and off."""
    return [
        dict(point_coords=np.array([[w * 0.5, h * 0.5]]), point_labels=np.array([1])),
        dict(point_coords=np.array([[w * 0.3, h * 0.6]]), point_labels=np.array([1]), multimask_output=False),
        dict(point_coords=np.array([[w * 0.4, h * 0.4], [w * 0.9, h * 0.1]]), point_labels=np.array([1, 0])),
        dict(box=np.array([w * 0.1, h * 0.2, w * 0.7, h * 0.9])),
        dict(box=np.array([w * 0.25, h * 0.25, w * 0.5, h * 0.6]), multimask_output=False),
        dict(point_coords=np.array([[w * 0.3, h * 0.3]]), point_labels=np.array([1]), box=np.array([0, 0, w * 0.6, h * 0.6])),
    ]


def assert_same_outputs(ours, ref) -> None:
    """ours: masks, IoU, low-res logits; ref: the same with full-resolution logits for masks (return_logits)."""
    masks, iou, low_res = ours
    ref_logits, ref_iou, ref_low_res = ref
    assert low_res.shape == ref_low_res.shape
    np.testing.assert_allclose(low_res, ref_low_res, rtol=0, atol=LOGITS_ATOL)
    np.testing.assert_allclose(iou, ref_iou, rtol=0, atol=LOGITS_ATOL)
    assert_masks_equal_away_from_threshold(masks, ref_logits, atol=LOGITS_ATOL)
