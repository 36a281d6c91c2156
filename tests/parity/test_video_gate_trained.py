"""The video gate on the packaged sam2.1_hiera_nano, whose video modules are trained
(tinysam.train_tracking): its masks follow the objects, so J&F and objects lost are gated, and the
three planted defects of tests/parity/test_video_gate.py fail on them, not only on the logits and
object scores that seeded weights are gated on. The gate's default clip (one generated clip of 6
frames, input 256), fp32 on the CPU.

Measured with the shipped file (sha256 8ca7b48b…; 2-core CPU, torch 2.14.1; limits of [video.fp32]:
J&F mean 0.995, objects lost 0, object scores 1e-3 relative; [video.bf16]: 0.98, 0, 0.05): fp32+sdpa
equals the golden's masks and scores exactly; bf16+sdpa passes (J&F 0.997, object scores 0.014 relative);
one memory fewer: J&F mean 0.972 (worst 0.79), object scores 0.15 relative in fp32, 0.16 in bf16+sdpa;
object pointers zeroed: J&F mean 0.50, 10 object-frames lost; objects 1 and 2 given each other's click:
J&F mean 0.52, 12 lost. Runtime: ~40 s on 2 CPU cores (a golden and six checks of 18 tracking steps).
"""

from __future__ import annotations

import numpy as np
import pytest

from parity.tasks.source import ModelSource
from parity.tasks.video import runner
from parity.tasks.video.compare import object_score_error
from samfast.checkpoint import TRAINED_CHECKPOINTS
from tests.planted import drop_oldest_memory, failed_gates, swap_first_two_clicks, zero_object_pointers

SPEC = runner.VideoSpec()  # the gate's default: one clip of 6 frames at input 256
SOURCE = ModelSource("sam2.1_hiera_nano", TRAINED_CHECKPOINTS["sam2.1_hiera_nano"])


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    return runner.make_golden(SOURCE, SPEC, device="cpu", root=tmp_path_factory.mktemp("golden"))


def check(golden, tmp_path, stage="fp32"):
    [result], _ = runner.run_check(SOURCE, SPEC, [stage], device="cpu", golden=golden, report_dir=tmp_path)
    return result


def test_the_trained_tracker_is_gated_on_its_masks_and_passes(golden, tmp_path):
    result = check(golden, tmp_path, "fp32+sdpa")
    assert result.passed, result.gates
    gated = {g.metric for g in result.gates if g.gated}
    assert {"jf_mean", "jf_worst", "objects_lost"} <= gated
    # the masks mean something: J&F against the ground truth (measured 0.82; seeded weights' masks are noise)
    assert result.summary["jf_gt_mean"] > 0.7


def test_bf16_tracks_within_its_limits(golden, tmp_path):
    result = check(golden, tmp_path, "bf16+sdpa")
    assert result.passed, result.gates
    # not bit-equal: bf16 moved the scores (0.014 relative, measured)
    assert result.summary["object_score_max_rel_err"] > 0


@pytest.mark.parametrize("stage", ["fp32", "bf16+sdpa"])
def test_dropped_memory_fails(golden, tmp_path, monkeypatch, stage):
    """The masks move (J&F mean 0.97 against limits of 0.995 and 0.98) and the object scores more (0.15-0.16
    relative against 1e-3 and 0.05): with the earlier file (object-score head frozen), whose
    tracker never called an object absent, only the scores caught it."""
    drop_oldest_memory(monkeypatch)
    assert {"jf_mean", "object_score_max_rel_err"} <= failed_gates(check(golden, tmp_path, stage))


def test_object_score_error_is_absolute_near_the_decision_and_relative_above():
    golden = np.array([[0.5, -0.2, 10.0, np.nan]], dtype=np.float32)
    assert object_score_error(golden + np.float32([[0.1, 0.1, 0, 0]]), golden) == pytest.approx(0.1)
    assert object_score_error(golden + np.float32([[0, 0, 1.0, 0]]), golden) == pytest.approx(0.1)  # 1 of 10
    assert object_score_error(golden, golden) == 0.0  # NaN on both sides: no output there on either
    assert object_score_error(np.nan_to_num(golden), golden) == np.inf  # an output the golden has not


def test_zeroed_object_pointers_lose_the_objects(golden, tmp_path, monkeypatch):
    zero_object_pointers(monkeypatch)
    assert {"jf_mean", "jf_worst", "objects_lost"} <= failed_gates(check(golden, tmp_path))


def test_prompts_given_to_another_object_lose_the_objects(golden, tmp_path, monkeypatch):
    swap_first_two_clicks(monkeypatch)
    assert {"jf_mean", "jf_worst", "objects_lost"} <= failed_gates(check(golden, tmp_path))
