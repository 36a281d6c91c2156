"""The gate end to end on vit_tiny: golden round trip, refusal of foreign goldens, planted defects."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from parity.golden import manifest as golden_io
from parity.golden import store
from parity.golden.data import load_dataset
from parity.tasks.point import golden as point_golden
from parity.tasks.point.runner import make_golden, run_check
from parity.tasks.source import ModelSource
from tests.planted import perturb_decoder

LIMIT = 2  # two generated scenes: 18 annotations, a few seconds per stage on the CPU


@pytest.fixture(scope="module")
def scenes():
    return load_dataset("scenes", limit=LIMIT)


@pytest.fixture(scope="module")
def synthetic_golden(scenes, tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    return make_golden(ModelSource("vit_tiny"), scenes, device="cpu", root=root)


@pytest.fixture(scope="module")
def checkpoint_file(tmp_path_factory):
    """Synthetic weights saved as a file: a 'real' checkpoint to the gate, so mask IoU gates too."""
    import samfast

    path = tmp_path_factory.mktemp("ckpt") / "sam_vit_tiny_test.pth"
    torch.save(samfast.synthetic_state_dict("vit_tiny", seed=0), path)
    return path


def test_golden_round_trip(synthetic_golden, scenes):
    manifest, outputs = point_golden.read_golden(synthetic_golden)
    assert manifest["model_type"] == "vit_tiny"
    assert manifest["dataset_fingerprint"] == scenes.fingerprint
    assert manifest["prompt_policy"] == "centre-point-v1"
    assert manifest["fp32_settings"]["matmul_allow_tf32"] is False
    assert not torch.are_deterministic_algorithms_enabled()  # made under them, and they were put back
    assert manifest["masks_meaningful"] is False
    assert len(outputs.annotations) == scenes.num_annotations == manifest["annotations"]
    first = outputs.annotations[0]
    assert len(first.rles) == 3 and len(first.scores) == 3 and 0 <= first.best < 3
    assert first.best == int(np.argmax(first.scores))
    assert len(outputs.logits) == 8 and all(v.shape == (3, 256, 256) for v in outputs.logits.values())
    # JSON + NPZ only, no pickle anywhere
    assert sorted(p.name for p in synthetic_golden.iterdir()) == ["logits.npz", "manifest.json", "predictions.json.gz"]


def test_fp32_passes_with_iou_one(synthetic_golden, scenes, tmp_path, tf32_checked_off):
    results, paths = run_check(ModelSource("vit_tiny"), scenes, ["fp32"], data_args="--data scenes",
                               device="cpu", golden=synthetic_golden, report_dir=tmp_path)
    (result,) = results
    assert result.passed, result.failures
    assert result.summary["mask_iou_mean"] == 1.0 and result.summary["mask_iou_min"] == 1.0
    assert result.summary["logits_rel_l2"] == 0.0  # same device, same code: bit-identical
    report = json.loads(paths["report.json"].read_text())
    assert report["passed"] is True
    assert 'failures="0"' in paths["junit.xml"].read_text()


def _perturbed_build(source: ModelSource, scale: float):
    def build(stages: str):
        return perturb_decoder(source.build(stages, torch.device("cpu"), 8), scale, seed=123)

    return build


def test_planted_defect_fails_and_names_worst_annotations(checkpoint_file, scenes, tmp_path):
    source = ModelSource("vit_tiny", checkpoint_file)
    golden = make_golden(source, scenes, device="cpu", root=tmp_path / "golden")
    results, paths = run_check(source, scenes, ["fp32"], data_args="--data scenes", device="cpu", golden=golden,
                               report_dir=tmp_path / "report", build=_perturbed_build(source, scale=0.5))
    (result,) = results
    assert not result.passed
    failed = {g.metric for g in result.failures}
    assert "logits_rel_l2" in failed and "mask_iou_mean" in failed
    report = paths["report.md"].read_text()
    assert "**FAIL**" in report and "## fp32: what failed" in report
    worst = result.worst[0]
    assert worst["iou_vs_golden"] < 0.9
    assert f"| {worst['ann_id']} | {worst['image_id']} |" in report
    assert 'failures="1"' in paths["junit.xml"].read_text()


def test_planted_defect_fails_on_synthetic_weights_through_logits(synthetic_golden, scenes, tmp_path):
    """Seeded weights: masks are not gated, yet a perturbed decoder still fails on its logits."""
    source = ModelSource("vit_tiny")
    results, _ = run_check(source, scenes, ["fp32"], data_args="--data scenes", device="cpu", golden=synthetic_golden,
                           report_dir=tmp_path, build=_perturbed_build(source, scale=0.05))
    assert [g.metric for g in results[0].failures][:1] == ["logits_rel_l2"]


def test_golden_of_another_checkpoint_is_refused(synthetic_golden, scenes, tmp_path):
    with pytest.raises(golden_io.GoldenMismatch, match=r"(?s)another checkpoint.*\(synthetic seed 0\).*python -m parity golden --model vit_tiny --seed 1 --data scenes"):
        run_check(ModelSource("vit_tiny", seed=1), scenes, ["fp32"], data_args="--data scenes", device="cpu",
                  golden=synthetic_golden, report_dir=tmp_path)


def test_golden_of_another_dataset_or_prompt_policy_is_refused(synthetic_golden, tmp_path):
    with pytest.raises(golden_io.GoldenMismatch, match="another dataset"):
        run_check(ModelSource("vit_tiny"), load_dataset("scenes", limit=1), ["fp32"], data_args="--data scenes --limit 1",
                  device="cpu", golden=synthetic_golden, report_dir=tmp_path)
    with pytest.raises(golden_io.GoldenMismatch, match="another prompt policy"):
        run_check(ModelSource("vit_tiny"), load_dataset("scenes", limit=LIMIT), ["fp32"], data_args="--data scenes",
                  prompt="box", device="cpu", golden=synthetic_golden, report_dir=tmp_path)


def test_missing_golden_says_how_to_make_one(scenes, tmp_path):
    with pytest.raises(golden_io.GoldenMissing, match="python -m parity golden"):
        run_check(ModelSource("vit_tiny"), scenes, ["fp32"], data_args="--data scenes", device="cpu",
                  golden=tmp_path / "nothing", report_dir=tmp_path)


def test_failed_regeneration_keeps_the_old_golden(synthetic_golden, scenes, monkeypatch):
    before = (synthetic_golden / "predictions.json.gz").read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store._fs, "write", broken)
    with pytest.raises(OSError, match="disk full"):
        make_golden(ModelSource("vit_tiny"), scenes, device="cpu", root=synthetic_golden.parent)
    assert (synthetic_golden / "predictions.json.gz").read_bytes() == before
    # No staging leftovers; the finished batches wait in the work folder, so a re-run only publishes.
    assert sorted(p.name for p in synthetic_golden.parent.iterdir()) == [f".{synthetic_golden.name}.work", synthetic_golden.name]


@pytest.mark.parametrize(("stages", "precision"), [
    ("fp32", "fp32"), ("fp32+sdpa", "fp32"), ("fp32+compile+sdpa+nt", "fp32"),  # fp32 math reordered: fp32's limits
    ("bf16", "bf16"), ("nt", "bf16"), ("int8", "int8"), ("bf16+sdpa+int8", "int8"),
    ("bf16+compile+sdpa+triton+nt+sparse", "sparse"),
])
def test_stage_is_held_to_the_precision_it_runs_in(stages, precision):
    from parity.compare.gates import load_thresholds, thresholds_for

    thresholds = load_thresholds()
    assert thresholds_for(stages, thresholds) is thresholds[precision]
    assert thresholds["fp32"]["max_logits_rel_l2"] < thresholds["bf16"]["max_logits_rel_l2"]


def _outputs(scores: list[float], masks: list[np.ndarray]):
    from parity.golden.rle import encode_rle
    from parity.tasks.point.produce import AnnotationOutput, StageOutputs

    ann = AnnotationOutput(ann_id=1, image_id=1, category_id=1, scores=scores, best=int(np.argmax(scores)),
                           rles=[encode_rle(m) for m in masks], gt_iou=0.5)
    return StageOutputs([ann], {}, images=1, seconds=1.0, first_batch_images=1, first_batch_seconds=1.0)


@pytest.mark.parametrize(("golden_scores", "passes"), [
    ([0.900, 0.895, 0.30], True),  # the golden nearly ties masks 0 and 1: a flip to 1 is rounding
    ([0.900, 0.500, 0.30], False),  # a clear winner: choosing mask 1 is an error
])
def test_best_mask_flip_is_forgiven_only_on_a_near_tie(golden_scores, passes):
    from parity.compare.gates import load_thresholds, thresholds_for
    from parity.tasks.point.compare import compare

    masks = [np.zeros((32, 32), bool) for _ in range(3)]
    masks[0][:16], masks[1][16:], masks[2][:, :4] = True, True, True  # three disjoint masks
    ours_scores = [golden_scores[1] - 0.001, golden_scores[1], golden_scores[2]]  # picks mask 1
    limits = thresholds_for("bf16", load_thresholds())  # a near tie: golden scores within max_score_abs_err
    result = compare("bf16", _outputs(ours_scores, masks), _outputs(golden_scores, masks), limits, masks_meaningful=True)
    assert result.summary["best_mask_changed"] == 1
    assert result.summary["best_mask_near_ties"] == (1 if passes else 0)
    assert result.summary["mask_iou_mean"] == (1.0 if passes else 0.0)
    assert result.passed is passes
