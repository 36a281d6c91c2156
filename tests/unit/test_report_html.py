"""reports/report.html: self-contained, the verdict and the worst annotations' pictures, as a real browser renders it."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

from parity.compare.gates import Gate, StageResult
from parity.golden.data import load_dataset
from parity.report.html import CHROMIUM_INSTALL, dump_dom, find_chromium, render_html, screenshot
from parity.report.pictures import mask_comparison_png
from parity.report.verdicts import stages_to_show
from parity.tasks.point.report import _draw_limits, html_layout, render_markdown
from parity.tasks.point.runner import make_golden, run_check
from parity.tasks.source import ModelSource
from samfast.checkpoint import NAMED_CHECKPOINTS
from tests.parity.test_gate import _perturbed_build

HEADER = {"model_type": "vit_tiny", "checkpoint": "test", "dataset": "scenes (1 images)", "annotations": 2,
          "prompt": "point", "golden": "golden/x", "golden_device": "cpu", "golden_torch": "2", "device": "cpu",
          "torch": "2", "masks_meaningful": True}
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason=f"no Chromium: install it with `{CHROMIUM_INSTALL}`")


def _picture() -> bytes:
    golden, stage = np.zeros((40, 60), bool), np.zeros((40, 60), bool)
    golden[10:30, 10:40], stage[12:32, 20:50] = True, True
    return mask_comparison_png(np.full((40, 60, 3), 128, np.uint8), golden, stage, point=(25, 20), title="test")


def _page(results: list[StageResult]) -> str:
    return render_html(HEADER, results, _picture(), html_layout(HEADER))


def _stage(name: str, iou: float, pictures: bool = True) -> StageResult:
    worst = [{"ann_id": i, "image_id": 1, "iou_vs_golden": iou, "best": 0, "golden_best": 0, "near_tie": i == 2,
              "score_abs_err": 0.0} for i in (1, 2)]
    gates = [Gate("mask_iou_mean", iou, 0.99, "min", True), Gate("logits_rel_l2", 1e-4, 1e-3, "max", True)]
    return StageResult(name, gates, {"steady_img_s": None}, worst,
                       pictures={w["ann_id"]: _picture() for w in worst} if pictures else {})


def test_gate_ratio_is_the_share_of_the_limit_used():
    assert Gate("logits_rel_l2", 5e-4, 1e-3, "max", True).ratio == pytest.approx(0.5)
    assert Gate("mask_iou_mean", 0.995, 0.99, "min", True).ratio == pytest.approx(0.5)  # half the IoU loss allowed
    assert Gate("mask_iou_mean", 0.98, 0.99, "min", True).ratio == pytest.approx(2.0)
    assert Gate("mask_iou_mean", 0.9905, 0.99, "min", True).near_failing  # 0.95 of the limit, still passing
    assert not Gate("mask_iou_mean", 0.9905, 0.99, "min", False).near_failing  # reported only: never near-failing


def test_page_is_self_contained_with_one_picture_per_worst_annotation():
    results = [_stage("fp32", 0.999), _stage("bf16", 0.9), _stage("nt", 0.9905)]  # pass, fail, near-failing
    results.append(StageResult("fp32+triton", [Gate("logits_rel_l2", 0.0, 1e-3, "max", True)], {}, not_exercised=["fell back"]))
    page = _page(results)
    assert '<div class="banner fail"><h1>FAIL</h1>' in page
    assert "<h2>bf16: what failed</h2>" in page and "<h2>nt: near the limit</h2>" in page and "<h2>fp32:" not in page
    assert page.count('<img class="worst"') == 4  # two per shown stage
    assert "fp32+triton</b> not exercised: fell back" in page
    assert re.findall(r'(?:src|href)="(?!data:image/png;base64,)', page) == []  # nothing loaded from elsewhere
    assert "<script" not in page


def test_every_report_details_the_failing_stages_then_the_near_failing_ones():
    """One rule (parity.report.verdicts.stages_to_show): the point markdown used to leave out the near-failing
    stages that the HTML page and the AMG markdown showed."""
    results = [_stage("fp32", 0.999), _stage("nt", 0.9905), _stage("bf16", 0.9)]  # pass, near-failing, fail
    for r in results:
        r.summary = {key: 0.5 for key in ("logits_rel_l2", "score_max_abs_err", "mask_iou_mean", "mask_iou_p5",
                                          "masks_below_half", "best_mask_changed", "best_mask_near_ties", "miou_gt",
                                          "miou_gt_golden", "steady_img_s", "first_batch_seconds")}
    assert [r.stage for r in stages_to_show(results)] == ["bf16", "nt"]
    assert re.findall(r"^## (\S+): (.+)$", render_markdown(HEADER, results), re.M) == [
        ("bf16", "what failed"), ("nt", "near the limit")]
    assert re.findall(r"<h2>(\S+):", _page(results)) == ["bf16", "nt"]


@pytest.mark.parametrize(("stages", "banner"), [(["fp32"], "pass"), (["fp32", "fp32+triton"], "notex")])
def test_banner_says_pass_or_not_exercised(stages, banner):
    results = [_stage(s, 0.999) for s in stages]
    for result in results[1:]:
        result.not_exercised.append("fell back")
    assert f'<div class="banner {banner}">' in _page(results)


def test_plot_draws_each_stage_limit():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    _draw_limits(ax, [_stage("fp32", 0.999), _stage("bf16", 0.9)], "mask_iou_mean")
    assert [seg[0][1] for lines in ax.collections for seg in lines.get_segments()] == [0.99, 0.99]
    plt.close(fig)


def test_picture_refuses_masks_of_another_size():
    with pytest.raises(ValueError, match=r"golden mask \(4, 4\) and stage mask \(5, 5\) differ"):
        mask_comparison_png(np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4), bool), np.zeros((5, 5), bool))


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory):
    """The embedded trained model on one scene with its decoder weights perturbed: a failing stage."""
    source = ModelSource("vit_tiny", NAMED_CHECKPOINTS["trained"])
    scene = load_dataset("scenes", limit=1)
    golden = make_golden(source, scene, device="cpu", root=tmp_path_factory.mktemp("golden"))
    (result,), paths = run_check(source, scene, ["fp32"], data_args="--data scenes --limit 1", device="cpu",
                                 golden=golden, report_dir=tmp_path_factory.mktemp("report"),
                                 build=_perturbed_build(source, scale=0.3))
    assert result.verdict == "fail" and len(result.worst) == 5
    return result, paths["report.html"]


def _pixel_std(png) -> float:
    return float(np.asarray(Image.open(io.BytesIO(png.read_bytes())).convert("L"), dtype=np.float64).std())


@needs_chromium
def test_chromium_renders_the_failing_report(failing_report, tmp_path):
    result, page = failing_report
    dom = dump_dom(page)
    assert '<h1>FAIL</h1>' in dom and f"<h2>{result.stage}: what failed</h2>" in dom
    assert dom.count('<img class="worst"') == len(result.worst)
    screenshot(page, tmp_path / "report.png")
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    screenshot(blank, tmp_path / "blank.png")
    assert _pixel_std(tmp_path / "blank.png") < 1  # the check's planted defect: an empty page is blank to it
    assert _pixel_std(tmp_path / "report.png") > 20


@needs_chromium
def test_chromium_renders_a_failing_video_report(tmp_path):
    """The video task's page through the same frame (its PageLayout): masks made to order, one object
    decaying over the last 10 of 100 frames (tests/unit/test_video_compare.py), fails on drift."""
    from parity.golden.videos import Clip
    from parity.tasks.video.report import write_reports
    from parity.tasks.video.pictures import worst_frame_picture
    from tests.unit.test_video_compare import run, shrunk, square

    failing = run(100, 90, shrunk(), stage="bf16")
    failing.pictures = worst_frame_picture(failing, [Clip(1, np.full((100, 20, 20, 3), 90, np.uint8),
                                                          np.stack([np.stack([square()] * 100)] * 2))])
    header = {"model_type": "sam2.1_hiera_nano", "checkpoint": "test", "dataset": "made to order", "golden": "golden/x",
              "golden_device": "cpu", "golden_torch": "2", "device": "cpu", "torch": "2", "input_size": 256,
              "prompt_policy": "test", "masks_meaningful": True}
    page = write_reports(tmp_path, header, [run(100, 100), failing])["report.html"]
    dom = dump_dom(page)
    assert "<h1>FAIL</h1>" in dom and "<h2>bf16: what failed</h2>" in dom and dom.count('<img class="worst"') == 1
    assert "drift_j_fall 0.1 (needs &lt;= 0.01): FAIL" in dom
    screenshot(page, tmp_path / "shot.png")
    assert _pixel_std(tmp_path / "shot.png") > 20
