"""bench.amg's plumbing on the CPU at the smallest size (via bench.ladder --amg, as `nox -s bench -- --amg` calls it)."""

from __future__ import annotations

import json

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
    table = (tmp_path / "amg.md").read_text()
    assert "| vit_tiny | zero | samfast | fp32 |" in table and "| vit_tiny | default | reference | fp32 |" in table
