"""bench.ladder end to end on the CPU at the smallest size: it writes the table, the JSON and the chart."""

from __future__ import annotations

import json

from bench import ladder


def test_quick_cpu_run_writes_markdown_json_and_chart(tmp_path):
    # one samfast stage beside the reference: the plumbing is the same for every stage (each costs ~20 s here)
    assert ladder.main(["--quick", "--cpu", "--models", "vit_tiny", "--batches", "1", "--stages", "fp32+nt",
                        "--reference", "fp32", "--profile", "vit_tiny:1:fp32+nt", "--warmup", "0", "--repeats", "1",
                        "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert [r["stage"] for r in results] == ["reference fp32", "fp32+nt"]
    for r in results:
        assert r["error"] is None and r["encoder_img_s"] > 0 and r["e2e_img_s"] > 0, r
    table = (tmp_path / "bench.md").read_text()
    assert "| vit_tiny | 1 | fp32+nt |" in table and (tmp_path / "bench.png").stat().st_size > 0
    # the profiled row names where the time goes, for the encoder alone and for the whole pipeline
    profiled = results[-1]["notes"]["profile"]
    assert set(profiled) == {"encoder", "e2e"} and all(profiled[part] for part in profiled)
    assert "fp32+nt, encoder" in table and "fp32+nt, e2e" in table
