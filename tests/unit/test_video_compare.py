"""The video check's figures from masks made to order (parity.tasks.video.compare): drift over the frames
the video target names (the last 10 against the first 10; a short clip's quarters) and its gate, J by frame index,
and the worst object-frame's masks kept for its picture."""

from __future__ import annotations

import numpy as np
import pytest

from parity.compare.gates import load_thresholds, thresholds_for
from parity.golden.videos import Clip
from parity.tasks.video.compare import compare
from parity.tasks.video.produce import ClipOutputs

SIDE = 20  # a 20 x 20 frame; each object a square of 10 x 10


def square(shift: int = 0) -> np.ndarray:
    mask = np.zeros((SIDE, SIDE), bool)
    mask[5:15, 5 + shift:15 + shift] = True
    return mask


def outputs(masks: np.ndarray) -> ClipOutputs:
    objects, frames = masks.shape[:2]
    return ClipOutputs(video_id=1, masks=masks, object_scores=np.ones((objects, frames), np.float32),
                       logits={0: np.zeros((objects, SIDE, SIDE), np.float32)})


def shrunk() -> np.ndarray:
    """The square less its bottom row: J 0.9, its boundary within the F tolerance of the square's."""
    mask = square()
    mask[14] = False
    return mask


def run(frames: int, shifted_from: int, stage_mask: np.ndarray | None = None, stage: str = "fp32",
        masks_meaningful: bool = True, until: int | None = None):
    """Two objects; from frame `shifted_from` on (to `until`) the stage's second object is `stage_mask`, by
    default the square slid one pixel right (J 9/11)."""
    golden = np.stack([np.stack([square()] * frames)] * 2)
    ours = golden.copy()
    ours[1, shifted_from:until] = square(1) if stage_mask is None else stage_mask
    return check(golden, ours, stage, masks_meaningful)


def check(golden: np.ndarray, ours: np.ndarray, stage: str = "bf16", masks_meaningful: bool = True):
    """One clip's (objects, frames, H, W) golden and stage masks compared under the stage's video limits."""
    clip = Clip(1, np.zeros((golden.shape[1], SIDE, SIDE, 3), np.uint8), golden)
    limits = thresholds_for(stage, load_thresholds(table="video"))
    return compare(stage, [outputs(ours)], [outputs(golden)], [clip], limits, masks_meaningful=masks_meaningful)


def gate(result, metric: str):
    return next(g for g in result.gates if g.metric == metric)


OFF = 2 / 11  # J lost on a frame where the square is one pixel over: 1 - 90 / 110


@pytest.mark.parametrize(("frames", "shifted_from", "drift"), [
    (100, 85, -OFF),  # the last 10 frames all off (the last quarter would say -0.6 x OFF)
    (100, 95, -OFF / 2),  # half of the last 10
    (100, 5, -OFF / 2),  # half of the first 10 and all of the last 10
    (12, 9, -OFF),  # a clip under 40 frames compares its quarters: the last 3 frames against the first 3
])
def test_drift_compares_the_last_10_frames_with_the_first_10(frames, shifted_from, drift):
    assert run(frames, shifted_from).summary["drift_j_worst"] == pytest.approx(drift)


def test_a_track_that_decays_over_its_last_frames_fails_on_drift_alone():
    """Planted defect: in bf16 the second object loses a row over the last 10 of 100 frames. Every
    object-frame stays well above the J&F floors (mean 0.99, worst 0.95); the drift gate catches it."""
    result = run(100, 90, shrunk(), stage="bf16")
    failed = {g.metric for g in result.gates if g.gated and not g.passed}
    assert failed == {"drift_j_fall"}
    assert gate(result, "drift_j_fall").value == pytest.approx(0.1)
    assert result.summary["jf_mean"] > 0.98 and result.summary["jf_worst"] > 0.8


def test_drift_passes_a_steady_track_and_a_track_that_recovers():
    assert gate(run(100, 100), "drift_j_fall").passed  # no defect: 0
    recovering = run(100, 0, until=10)  # off over the first 10 frames only: J rises, it does not fall
    assert recovering.summary["j_by_frame"][0] < recovering.summary["j_by_frame"][-1] == 1.0
    recovering_gate = gate(recovering, "drift_j_fall")
    assert recovering_gate.gated and recovering_gate.passed and recovering_gate.value == 0.0


@pytest.mark.parametrize(("frames", "masks_meaningful"), [(39, True), (100, False)])
def test_drift_is_reported_not_gated_on_a_clip_under_40_frames_or_on_weights_that_do_not_segment(
        frames, masks_meaningful):
    result = run(frames, frames - 3, shrunk(), stage="bf16", masks_meaningful=masks_meaningful)
    drift = gate(result, "drift_j_fall")
    assert not drift.gated and not drift.passed and drift.describe().endswith("past the limit (not gated)")
    assert not result.failures  # reported, not failed


def test_drift_reads_only_the_frames_where_the_golden_has_the_object():
    """An object that enters halfway, one row short on every frame it is in: a steady J of 0.9, no drift.
    Counting the frames before it (empty on both sides, J 1) would read a fall of 0.1 and fail a healthy
    stage."""
    golden = np.stack([np.stack([square()] * 100)] * 2)
    golden[1, :50] = False
    ours = golden.copy()
    ours[1, 50:] = shrunk()
    drift = gate(check(golden, ours), "drift_j_fall")
    assert drift.gated and drift.passed and drift.value == pytest.approx(0.0)


def test_an_object_on_fewer_than_40_frames_is_reported_beside_the_gated_ones():
    """The second object is in the last 20 frames only and decays there: its quarters are reported as the
    worst drift; the gate reads the first object, present on all 100 frames and steady."""
    golden = np.stack([np.stack([square()] * 100)] * 2)
    golden[1, :80] = False
    ours = golden.copy()
    ours[1, 95:] = shrunk()
    result = check(golden, ours)
    assert result.summary["drift_j_worst"] == pytest.approx(-0.1)  # the last 5 of its 20 frames at J 0.9
    drift = gate(result, "drift_j_fall")
    assert drift.gated and drift.passed and drift.value == 0.0


def test_j_by_frame_is_the_mean_over_objects():
    result = run(12, 9)
    assert result.summary["j_by_frame"] == pytest.approx([1.0] * 9 + [(1 + 9 / 11) / 2] * 3)


def test_the_worst_object_frame_s_masks_go_with_the_result():
    result = run(12, 9)
    worst = result.worst[0]
    assert (worst["object_id"], worst["j"]) == (2, pytest.approx(9 / 11))
    golden_mask, stage_mask = result.worst_masks[0]
    assert np.array_equal(golden_mask, square()) and np.array_equal(stage_mask, square(1))
