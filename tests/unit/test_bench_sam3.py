"""bench.sam3 on the CPU at the reduced SAM 3: sam3's rows from its modules built at the same sizes
(tests/sam3_modules.py; sam3's builder makes the full-size model only), samfast's from build_sam, the
same seeded weights in both. The timings mean nothing here; the rows, the kept counts and the files do."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")
pytest.importorskip("open_clip", reason="SAM 3's tokenizer needs open_clip_torch")

from bench import sam3 as bench_sam3  # noqa: E402
from samfast.sam3.checkpoint import model_layout  # noqa: E402
from samfast.sam3.config import SAM3_REDUCED  # noqa: E402
from tests.sam3_modules import sam3_image_model, sam3_interactive_predictor  # noqa: E402
from tests.sam3_reference import on_cpu  # noqa: E402

REFERENCE_CONFIG = replace(SAM3_REDUCED, add_sam2_neck=True)


def reduced_reference(model_type: str, mode: str, checkpoint: dict, device):
    """What bench.sam3.sam3_model gives, at the reduced sizes: sam3's image model with its point and box
    predictor, samfast's seeded weights loaded strictly."""
    assert (model_type, mode) == ("sam3_reduced", "fp32")
    model = sam3_image_model(REFERENCE_CONFIG)
    model.inst_interactive_predictor = sam3_interactive_predictor(REFERENCE_CONFIG)
    model.load_state_dict(model_layout(checkpoint, model.state_dict()), strict=True)
    return model.eval()


def test_a_cpu_run_times_every_workload_for_both_and_they_keep_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_sam3, "sam3_model", reduced_reference)
    # threshold 0: every query of every pair is kept, so the counts say that every pair ran
    with on_cpu():
        assert bench_sam3.main(["--model", "sam3_reduced", "--device", "cpu", "--sam3", "fp32", "--stages", "fp32",
                                "--images", "2", "--phrases", "3", "--threshold", "0", "--warmup", "0",
                                "--repeats", "1", "--iters", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "sam3.json").read_text())
    rows = {(r["impl"], r["workload"]): r for r in report["rows"]}
    assert list(rows) == [(impl, workload) for impl in ("sam3", "samfast") for workload in ("1 x 1", "2 x 3", "1 point")]
    queries = SAM3_REDUCED.num_queries
    for impl in ("sam3", "samfast"):
        assert rows[impl, "1 x 1"]["instances"] == queries
        assert rows[impl, "2 x 3"]["instances"] == 2 * 3 * queries
        assert rows[impl, "1 point"]["instances"] == 3  # multimask_output: three masks for one click
    assert all(r["ms"] > 0 and "error" not in r["notes"] for r in report["rows"])
    table = (tmp_path / "sam3.md").read_text()
    assert "| samfast | fp32 | 1 point |" in table and "| sam3 | fp32 | 1 point |" in table
    assert "- samfast fp32, 1 point: fp32 " in table  # the speed-up against sam3's row of the same workload
    assert (tmp_path / "sam3.png").stat().st_size > 0


def test_sam3s_rows_at_a_smaller_model_are_refused_with_the_way_out(tmp_path):
    with pytest.raises(SystemExit, match="--sam3 with no modes"):
        bench_sam3.main(["--model", "sam3_reduced", "--device", "cpu", "--sam3", "fp32", "--stages", "fp32",
                         "--out", str(tmp_path)])
