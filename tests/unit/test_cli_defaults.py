"""`python -m parity check` with no weights named checks what the gate checks: the trained vit_tiny."""

from __future__ import annotations

import argparse

import pytest

from parity import cli


def _source(*argv):
    parser = argparse.ArgumentParser()
    cli._add_common(parser)
    return cli._model_source(parser.parse_args(list(argv)), parser)


def test_no_weights_named_is_the_trained_tiny_model():
    source = _source()
    assert source.model_type == "vit_tiny" and source.checkpoint.name == "vit_tiny_trained.pt"
    assert source.masks_meaningful


def test_seeded_weights_only_when_asked_for():
    source = _source("--seed", "3")
    assert source.checkpoint is None and source.seed == 3 and not source.masks_meaningful
    assert _source("--model", "vit_b", "--seed", "0").model_type == "vit_b"


@pytest.mark.parametrize("argv, message", [
    (["--model", "vit_b"], "--model vit_b needs weights: --checkpoint sam_vit_b_*.pth"),
    (["--checkpoint", "trained", "--seed", "1"], "--checkpoint and --seed exclude each other"),
])
def test_weights_that_cannot_be_meant_are_refused_with_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        _source(*argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["check", "--model", "sam3_reduced", "--seed", "0"], "--task point is not built for SAM 3 (sam3_reduced) yet; it gates SAM 1 ("),
    (["golden", "--task", "video", "--model", "vit_tiny"], "--task video is not built for SAM 1 (vit_tiny) yet; it gates SAM 2 ("),
])
def test_a_task_a_family_lacks_is_refused_naming_the_families_it_gates(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_check_ends_with_its_verdict_and_the_report_to_open(tmp_path):
    from parity.compare.gates import Gate, StageResult

    ok = StageResult("fp32", [Gate("mask_iou_mean", 1.0, 0.99, "min", True)], {})
    bad = StageResult("nt", [Gate("mask_iou_mean", 0.5, 0.99, "min", True)], {})
    line = cli.final_line([ok, bad], {"report.html": tmp_path / "report.html"})
    assert line.startswith("Verdict: FAIL, 1 of 2 stages pass (failed: nt); report: ")
    assert str(tmp_path / "report.html") in line
