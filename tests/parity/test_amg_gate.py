"""The AMG gate end to end on the trained vit_tiny: golden through the store, fp32 passes with IoU 1,
a perturbed decoder fails, goldens of other inputs or parameters are refused with exit 2."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from parity.cli import DEFAULT_GPU_STAGES, main
from parity.golden.data import load_dataset
from parity.report.pictures import PANEL
from parity.tasks import check
from parity.tasks.amg import golden as amg_golden
from parity.tasks.amg import runner as amg_runner
from parity.tasks.amg.embedded import EMBEDDED_GOLDEN
from parity.tasks.amg.produce import AmgParams, Generated
from parity.tasks.amg.report import picture_name
from parity.tasks.source import ModelSource, release_gpu_cache
from samfast.checkpoint import NAMED_CHECKPOINTS
from tests.planted import perturb_decoder

# One generated scene, a 3x3 grid: a few seconds per generation on the CPU.
PARAMS = AmgParams(points_per_side=3)
DATA_ARGS = "--data scenes --limit 1"


@pytest.fixture(scope="module")
def scene():
    return load_dataset("scenes", limit=1)


@pytest.fixture(scope="module")
def trained():
    return ModelSource("vit_tiny", NAMED_CHECKPOINTS["trained"])


@pytest.fixture(scope="module")
def golden(trained, scene, tmp_path_factory):
    return amg_runner.make_golden(trained, scene, PARAMS, device="cpu", root=tmp_path_factory.mktemp("golden"))


def test_golden_is_stored_reproducibly_with_its_parameters(golden):
    assert golden.name.endswith("-scenes-limit1-amg")
    manifest, images = amg_golden.read(golden, "regenerate")
    assert manifest["task"] == "amg" and manifest["amg_params"] == PARAMS.as_dict()
    assert manifest["masks"] == sum(len(r) for r in images.values()) > 0
    record = next(r for records in images.values() for r in records)
    assert set(record) == {"segmentation", "area", "bbox", "predicted_iou", "stability_score", "point_coords", "crop_box"}
    assert sorted(p.name for p in golden.iterdir()) == ["manifest.json", "masks.json.gz"]  # JSON only, no pickle
    # The bytes are a function of the content alone (sorted keys, gzip mtime 0): encoding the same
    # records again gives the same file. (That the records themselves repeat is the fp32 test below.)
    stored = (golden / amg_golden.MASKS_FILE).read_bytes()
    entries = json.loads(gzip.decompress(stored))["images"]
    again = Generated({e["image_id"]: e["masks"] for e in entries},
                      {e["image_id"]: {k: e[k] for k in ("file_name", "height", "width")} for e in entries}, 0.0)
    assert amg_golden.encode(again) == stored


def test_fp32_passes_with_iou_one(golden, trained, scene, tmp_path, tf32_checked_off):
    (result,), paths = amg_runner.run_check(trained, scene, ["fp32"], PARAMS, data_args=DATA_ARGS, device="cpu",
                                            golden=golden, report_dir=tmp_path)
    assert result.passed, [g.describe() for g in result.failures]
    s = result.summary
    assert s["union_iou_mean"] == s["matched_iou_mean"] == 1.0 and s["lost"] == s["new"] == 0
    assert s["predicted_iou_max_err"] == 0.0  # same device, same code: bit-identical
    assert json.loads(paths["report.json"].read_text())["passed"] is True
    assert 'failures="0"' in paths["junit.xml"].read_text()


def test_each_stage_first_hands_the_freed_gpu_memory_back(golden, trained, scene, tmp_path, monkeypatch):
    """The gate runs its checks beside its GPU pytest workers on one GPU: each stage starts by returning
    what the last one freed (parity.tasks.source.release_gpu_cache, in the check loop of every task)."""
    released = []
    monkeypatch.setattr(check, "release_gpu_cache", lambda: released.append(len(released)))
    results, _ = amg_runner.run_check(trained, scene, ["fp32", "fp32+sdpa"], PARAMS, data_args=DATA_ARGS, device="cpu",
                                      golden=golden, report_dir=tmp_path)
    assert len(results) == len(released) == 2


def test_release_gpu_cache_empties_the_cache_only_where_cuda_runs(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    release_gpu_cache()  # a CPU process: nothing to hand back, and CUDA is not started for it
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    release_gpu_cache()
    assert emptied == [True]


def test_perturbed_decoder_fails(golden, trained, scene, tmp_path):
    def build(stages: str):
        return perturb_decoder(trained.build(stages, torch.device("cpu"), 1), 0.5, seed=0)

    (result,), paths = amg_runner.run_check(trained, scene, ["fp32"], PARAMS, data_args=DATA_ARGS, device="cpu",
                                            golden=golden, report_dir=tmp_path, build=build)
    assert not result.passed and "union_iou_mean" in {g.metric for g in result.failures}
    report = paths["report.md"].read_text()
    assert "**FAIL**" in report and "## fp32: what failed" in report
    assert f"| {result.worst[0]['image_id']} |" in report
    # the worst image as a picture beside the report, linked from it, and gone when the next check starts
    picture = tmp_path / picture_name("fp32", result.worst[0]["image_id"])
    assert f"]({picture.name})" in report and picture.read_bytes().startswith(b"\x89PNG")
    with Image.open(picture) as shown:
        assert shown.width == 4 * PANEL + 3 * 4 and shown.getextrema() != ((250, 250),) * 3
    # and on the HTML page, under the stage that failed, with its gates as columns
    page = paths["report.html"].read_text()
    assert '<div class="banner fail">' in page and "<h2>fp32: what failed</h2>" in page
    assert page.count('<img class="worst"') == len(result.pictures) > 0 and "<th>union IoU mean</th>" in page
    assert f"image {result.worst[0]['image_id']}: union IoU mean {result.worst[0]['union_iou_mean']:.4f}" in page
    amg_runner.run_check(trained, scene, ["fp32"], PARAMS, data_args=DATA_ARGS, device="cpu", golden=golden,
                         report_dir=tmp_path)
    assert not picture.exists()


def _cli(capsys, report_dir: Path, *args) -> tuple[int, str]:
    """A check into report_dir, never the default: reports/ of the working tree is where a gate run's own
    AMG check writes beside these tests (a refused check first removes the folder's reports)."""
    code = main(["check", "--task", "amg", "--model", "vit_tiny", "--checkpoint", "trained", "--device", "cpu",
                 "--report-dir", str(report_dir), *args])
    return code, capsys.readouterr().err


def test_golden_of_other_parameters_is_refused_with_exit_2(golden, tmp_path, capsys):
    code, err = _cli(capsys, tmp_path, "--data", "scenes", "--limit", "1", "--points-per-side", "4", "--golden", str(golden))
    assert code == 2
    assert "points_per_side: golden 3, this run 4" in err
    assert "python -m parity golden --task amg" in err and "--limit 1 --points-per-side 4" in err


def test_golden_of_other_data_or_missing_is_refused_with_exit_2(golden, tmp_path, capsys):
    code, err = _cli(capsys, tmp_path, "--data", "scenes", "--limit", "2", "--points-per-side", "3", "--golden", str(golden))
    assert code == 2 and "another dataset" in err
    stale = tmp_path / "reports" / "amg" / "report.md"
    stale.parent.mkdir(parents=True)
    stale.write_text("**PASS** of an earlier run")  # must not outlive a check that stops on bad input
    code, err = _cli(capsys, tmp_path / "reports", "--data", "scenes", "--limit", "1", "--golden", str(tmp_path / "nothing"))
    assert code == 2 and "python -m parity golden --task amg" in err and not stale.exists()


def test_kernel_that_fell_back_is_not_exercised_and_require_gpu_fails_it(golden, tmp_path, monkeypatch, capsys):
    """Planted: fp32+triton on a CPU without TRITON_INTERPRET, where the kernel falls back on every call."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = ["--data", "scenes", "--limit", "1", "--points-per-side", "3", "--stages", "fp32+triton",
            "--golden", str(golden)]
    code, _ = _cli(capsys, tmp_path, *args)
    report = (tmp_path / "amg" / "report.md").read_text()
    assert code == 0 and "**NOT EXERCISED**" in report and "| fp32+triton | NOT EXERCISED |" in report
    assert "not exercised: a Triton kernel fell back to its reference path" in report
    assert json.loads((tmp_path / "amg" / "report.json").read_text())["verdict"] == "NOT EXERCISED"

    code, _ = _cli(capsys, tmp_path, *args, "--require-gpu")
    report = (tmp_path / "amg" / "report.md").read_text()
    assert code == 1 and "**FAIL**" in report and "FAIL: not exercised (--require-gpu)" in report


def test_point_golden_is_not_an_amg_golden(tmp_path, capsys):
    point_golden = next(p for p in amg_golden.golden_io.GOLDEN_ROOT.iterdir() if not p.name.endswith("-amg"))
    code, err = _cli(capsys, tmp_path, "--data", "scenes", "--golden", str(point_golden))
    assert code == 2 and str(point_golden) in err


def test_a_golden_of_nothing_is_refused():
    """Seeded weights: the default thresholds filter out every mask, and a golden of nothing gates nothing."""
    with pytest.raises(ValueError, match="found no mask on any of the 2 images"):
        amg_golden.refuse_useless({1: [], 2: []}, "lower the thresholds")


@pytest.mark.gpu
def test_embedded_amg_golden_passes_every_stage_on_the_gpu(tmp_path):
    """The GPU layer: every ladder stage through the generator vs the committed CPU fp32 golden."""
    code = main(["check", *EMBEDDED_GOLDEN, "--device", "cuda", "--stages", *DEFAULT_GPU_STAGES, "--report-dir", str(tmp_path)])
    print((tmp_path / "amg" / "report.md").read_text())
    assert code == 0
