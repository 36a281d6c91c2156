"""bench.amg's plumbing on the CPU at the smallest size (via bench.ladder --amg, as `nox -s bench -- --amg` calls it)."""

from __future__ import annotations

import json

import pytest

from bench import ladder


def test_quick_cpu_run_writes_markdown_and_json(tmp_path):
    assert ladder.main(["--amg", "--quick", "--cpu", "--models", "vit_tiny", "--stages", "fp32", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "amg.json").read_text())["results"]
    assert [(r["impl"], r["thresholds"]) for r in results] == [
        (impl, t) for impl in ("reference", "segment-anything-fast", "samfast") for t in ("default", "zero")
    ]
    for r in results:
        if r["impl"] == "segment-anything-fast" and r["error"]:
            continue  # recorded as not installed
        assert r["error"] is None and r["ms_per_image"] > 0 and r["masks"] is not None, r
        assert r["notes"]["compiled_while_timed"] == 0, r  # counted around the timed calls (bench.timing)
    table = (tmp_path / "amg.md").read_text()
    assert "| vit_tiny | zero | samfast | fp32 |" in table and "| vit_tiny | default | reference | fp32 |" in table


def test_quick_cpu_run_of_a_sam2_model_beside_sam2s_generator(tmp_path):
    """SAM 2 beside sam2's SAM2AutomaticMaskGenerator (no segment-anything-fast row), sam2's default
    thresholds; a stage not built for SAM 2 is recorded as not built."""
    pytest.importorskip("sam2", reason="the SAM 2 reference package sam2==1.1.0 is not installed")
    assert ladder.main(["--amg", "--quick", "--cpu", "--models", "sam2.1_hiera_nano", "--stages", "fp32", "sparse",
                        "--reference-thresholds", "default", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "amg.json").read_text())["results"]
    assert [(r["impl"], r["stage"], r["thresholds"]) for r in results] == [
        ("reference", "fp32", "default"), ("samfast", "fp32", "default"), ("samfast", "fp32", "zero"),
        ("samfast", "sparse", "default"), ("samfast", "sparse", "zero")]
    for r in results[:3]:
        assert r["error"] is None and r["ms_per_image"] > 0 and r["masks"] is not None, r
    for r in results[3:]:
        assert r["error"] is None and r["ms_per_image"] is None and r["skipped"].startswith("not built for SAM 2"), r
    table = (tmp_path / "amg.md").read_text()
    assert "| sam2.1_hiera_nano | default | reference | fp32 |" in table and "pred_iou 0.8 / stability 0.95" in table
