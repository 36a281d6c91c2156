"""The video check's figures from masks made to order (parity.tasks.video.compare): drift over the frames
issue 37 names (the last 10 against the first 10; a short clip's quarters), J by frame index, and the worst
object-frame's masks kept for its picture."""

from __future__ import annotations

import numpy as np
import pytest

from parity.compare.gates import load_thresholds, thresholds_for
from parity.golden.videos import Clip
from parity.tasks.video.compare import compare
from parity.tasks.video.track import ClipOutputs

SIDE = 20  # a 20 x 20 frame; each object a square of 10 x 10


def square(shift: int = 0) -> np.ndarray:
    mask = np.zeros((SIDE, SIDE), bool)
    mask[5:15, 5 + shift:15 + shift] = True
    return mask


def outputs(masks: np.ndarray) -> ClipOutputs:
    objects, frames = masks.shape[:2]
    return ClipOutputs(video_id=1, masks=masks, object_scores=np.ones((objects, frames), np.float32),
                       logits={0: np.zeros((objects, SIDE, SIDE), np.float32)})


def run(frames: int, shifted_from: int):
    """Two objects; the stage's second object slides one pixel right from frame `shifted_from` on (J 9/11)."""
    golden = np.stack([np.stack([square()] * frames)] * 2)
    ours = golden.copy()
    ours[1, shifted_from:] = square(1)
    clip = Clip(1, np.zeros((frames, SIDE, SIDE, 3), np.uint8), golden)
    limits = thresholds_for("fp32", load_thresholds(table="video"))
    return compare("fp32", [outputs(ours)], [outputs(golden)], [clip], limits, masks_meaningful=True)


OFF = 2 / 11  # J lost on a frame where the square is one pixel over: 1 - 90 / 110


@pytest.mark.parametrize(("frames", "shifted_from", "drift"), [
    (100, 85, -OFF),  # the last 10 frames all off (the last quarter would say -0.6 x OFF)
    (100, 95, -OFF / 2),  # half of the last 10
    (100, 5, -OFF / 2),  # half of the first 10 and all of the last 10
    (12, 9, -OFF),  # a clip under 40 frames compares its quarters: the last 3 frames against the first 3
])
def test_drift_compares_the_last_10_frames_with_the_first_10(frames, shifted_from, drift):
    assert run(frames, shifted_from).summary["drift_j_worst"] == pytest.approx(drift)


def test_j_by_frame_is_the_mean_over_objects():
    result = run(12, 9)
    assert result.summary["j_by_frame"] == pytest.approx([1.0] * 9 + [(1 + 9 / 11) / 2] * 3)


def test_the_worst_object_frame_s_masks_go_with_the_result():
    result = run(12, 9)
    worst = result.worst[0]
    assert (worst["object_id"], worst["j"]) == (2, pytest.approx(9 / 11))
    golden_mask, stage_mask = result.worst_masks[0]
    assert np.array_equal(golden_mask, square()) and np.array_equal(stage_mask, square(1))
