"""The concept gate end to end on the reduced SAM 3 (seeded weights): golden through the store, fp32 passes
with every figure exact, a perturbed detector fails, goldens of other inputs are refused with exit 2, and the
committed embedded golden passes every GPU stage on a GPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from parity.cli import main
from parity.golden.data import load_dataset
from parity.tasks.concept import golden as concept_golden
from parity.tasks.concept import runner
from parity.tasks.concept.embedded import EMBEDDED_GOLDEN
from parity.tasks.concept.report import picture_name
from parity.tasks.source import ModelSource
from tests.planted import perturb_parameters

THRESHOLD = 0.25  # seeded weights score every query near 0.25 (parity.tasks.concept.embedded)
DATA_ARGS = "--data scenes --limit 1"


@pytest.fixture(scope="module")
def scene():
    return load_dataset("scenes", limit=1)


@pytest.fixture(scope="module")
def seeded():
    return ModelSource("sam3_reduced", None, 0)


@pytest.fixture(scope="module")
def golden(seeded, scene, tmp_path_factory):
    return runner.make_golden(seeded, scene, THRESHOLD, device="cpu", root=tmp_path_factory.mktemp("golden"))


def test_golden_is_stored_reproducibly_with_its_parameters(golden, seeded, scene, tmp_path):
    manifest = json.loads((golden / "manifest.json").read_text())
    assert manifest["task"] == "concept" and manifest["confidence_threshold"] == THRESHOLD
    assert manifest["phrases"] == ["ellipse", "rectangle", "polygon", "star", "blob"]
    assert manifest["pairs"] == 5 and manifest["detections"] > 0 and "cgf1" in manifest["ground_truth"]
    payload = json.loads(gzip.decompress((golden / concept_golden.DETECTIONS_FILE).read_bytes()))
    assert [p["phrase"] for p in payload["images"][0]["pairs"]] == manifest["phrases"]
    again = runner.make_golden(seeded, scene, THRESHOLD, device="cpu", root=tmp_path)
    assert (again / concept_golden.DETECTIONS_FILE).read_bytes() == (golden / concept_golden.DETECTIONS_FILE).read_bytes()


def test_fp32_passes_with_every_figure_exact(golden, seeded, scene, tmp_path):
    (result,), paths = runner.run_check(seeded, scene, ["fp32"], THRESHOLD, data_args=DATA_ARGS, device="cpu",
                                        golden=golden, report_dir=tmp_path)
    assert result.passed, result.failures
    s = result.summary
    assert (s["union_iou_mean"], s["score_max_abs_err"], s["presence_max_abs_err"]) == (1.0, 0.0, 0.0)
    assert s["lost"] == s["new"] == 0 and s["matched"] == s["golden_detections"] > 0
    report = paths["report.md"].read_text()
    assert "**PASS**" in report and "seeded weights" in report and "cgF1" in report


def test_perturbed_detector_fails(golden, seeded, scene, tmp_path):
    def build(stages: str):
        model = seeded.build(stages, torch.device("cpu"), 1)
        perturb_parameters(model.transformer.decoder, 0.5, seed=0)
        return model

    (result,), paths = runner.run_check(seeded, scene, ["fp32"], THRESHOLD, data_args=DATA_ARGS, device="cpu",
                                        golden=golden, report_dir=tmp_path, build=build)
    assert not result.passed and {"score_max_abs_err", "presence_max_abs_err"} & {g.metric for g in result.failures}
    report = paths["report.md"].read_text()
    assert "**FAIL**" in report and "## fp32: what failed" in report
    picture = tmp_path / picture_name("fp32", 0)
    assert f"]({picture.name})" in report and picture.read_bytes().startswith(b"\x89PNG")
    page = paths["report.html"].read_text()
    assert '<div class="banner fail">' in page and "<th>presence err</th>" in page


def _cli(capsys, report_dir: Path, *args) -> tuple[int, str]:
    code = main(["check", "--task", "concept", "--model", "sam3_reduced", "--seed", "0", "--device", "cpu",
                 "--report-dir", str(report_dir), *args])
    return code, capsys.readouterr().err


def test_golden_of_another_threshold_or_data_is_refused_with_exit_2(golden, tmp_path, capsys):
    code, err = _cli(capsys, tmp_path, "--data", "scenes", "--limit", "1", "--confidence-threshold", "0.3",
                     "--golden", str(golden))
    assert code == 2 and "confidence_threshold: golden 0.25, this run 0.3" in err
    assert "python -m parity golden --task concept" in err and "--confidence-threshold 0.3" in err
    code, err = _cli(capsys, tmp_path, "--data", "scenes", "--limit", "2", "--confidence-threshold", "0.25",
                     "--golden", str(golden))
    assert code == 2 and "another dataset" in err


def test_other_families_and_bad_thresholds_are_refused_with_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["check", "--task", "concept", "--model", "vit_tiny", "--report-dir", str(tmp_path)])
    assert refused.value.code == 2 and "--task concept is not built for SAM 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        _cli(capsys, tmp_path, "--confidence-threshold", "1.5")
    assert refused.value.code == 2 and "pass a number in [0, 1)" in capsys.readouterr().err


def test_a_golden_of_nothing_is_refused():
    with pytest.raises(ValueError, match="no detection scored above the confidence threshold on any of the 2"):
        concept_golden.refuse_useless({1: [{"phrase": "a", "presence": 0.5, "detections": []}] * 2}, "Lower it.")


@pytest.mark.gpu
def test_embedded_concept_golden_passes_every_stage_on_the_gpu(tmp_path):
    """The GPU layer: every stage SAM 3 builds (bf16, compile, sdpa) against the committed CPU fp32 golden."""
    code = main(["check", *EMBEDDED_GOLDEN, "--device", "cuda", "--report-dir", str(tmp_path)])
    print((tmp_path / "concept" / "report.md").read_text())
    assert code == 0
