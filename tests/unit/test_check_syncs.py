"""The sync check must find a planted sync in a real GPU trace, name its op and line, and pass a
clean one. Fixtures: tests/fixtures/traces (README.md there says which are real)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from parity.checks.syncs import FINAL_SYNC, TIMED_REGION, assert_no_syncs, find_syncs, load_trace, profile_region

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
CLEAN, PLANTED, EDGES = TRACES / "clean.json", TRACES / "planted_sync.json", TRACES / "synthetic_edge_cases.json"


def test_clean_trace_has_no_syncs():
    assert find_syncs(CLEAN) == []
    assert_no_syncs(CLEAN)


def test_clean_trace_final_sync_is_only_excused_not_missed():
    # The deliberate final sync is in the trace; only the allowance keeps it out of the report.
    found = find_syncs(CLEAN, allowed=())
    assert [s["name"] for s in found] == ["cudaDeviceSynchronize"]


def test_planted_item_is_found_with_op_and_line():
    (sync,) = find_syncs(PLANTED)
    assert sync["name"] == "cudaStreamSynchronize"
    assert sync["dur"] > 0
    assert sync["aten_op"] == "aten::_local_scalar_dense"  # what .item() dispatches to
    # torch 2.11 (the capture) names the user function; 2.14 adds the exact line ("file:41 (in forward)")
    assert "capture_sync_fixtures.py" in sync["python_frame"] and "forward" in sync["python_frame"]


def test_planted_assertion_message_is_readable():
    with pytest.raises(AssertionError) as err:
        assert_no_syncs(PLANTED)
    message = str(err.value)
    for needed in ("1 host-device sync", "cudaStreamSynchronize", " us", "aten::_local_scalar_dense",
                   "capture_sync_fixtures.py", str(PLANTED), "https://ui.perfetto.dev"):
        assert needed in message


def test_gzipped_and_parsed_traces_read_the_same(tmp_path):
    gz = tmp_path / "planted.json.gz"
    with open(PLANTED, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    expected = find_syncs(PLANTED)
    assert find_syncs(gz) == expected
    assert find_syncs(str(gz)) == expected
    assert find_syncs(load_trace(PLANTED)) == expected
    bare_list = tmp_path / "list.json"  # the chrome format also allows a bare event list
    bare_list.write_text(json.dumps(load_trace(PLANTED)["traceEvents"]))
    assert find_syncs(bare_list) == expected


def test_synthetic_edge_cases():
    found = find_syncs(EDGES)
    assert [(s["name"], s["aten_op"], s["python_frame"]) for s in found] == [
        # .item(): the exact line comes from the CallFrom of the frame forward called
        ("cudaStreamSynchronize", "aten::_local_scalar_dense", "model.py:14 (in forward)"),
        # a blocking copy; no CallFrom in this trace, so the user function's own frame
        ("cudaMemcpy", "aten::copy_", "model.py(20): helper"),
        # a driver-level sync outside any aten op (per-thread default stream suffix)
        ("cuStreamSynchronize_ptsz", None, "model.py(10): forward"),
    ]
    # not reported: cudaMemcpyAsync, launches, GPU-side memcpy rows, a cpu_op merely named like a
    # sync, the final sync (allowed), and a sync after the timed region.
    assert len(find_syncs(EDGES, allowed=())) == 4
    assert len(find_syncs(EDGES, allowed=(), region=None)) == 5


def test_without_region_annotation_the_whole_trace_counts():
    trace = load_trace(EDGES)
    events = [e for e in trace["traceEvents"] if e.get("name") != TIMED_REGION]
    assert len(find_syncs({"traceEvents": events})) == 4  # incl. the one after the region


def test_profile_region_writes_an_annotated_trace(tmp_path):
    # CPU only here: checks the plumbing (annotations, python frames, export), not CUDA syncs.
    import torch

    model = torch.nn.Linear(8, 8)
    path = profile_region(lambda: model(torch.randn(2, 8)), trace_path=tmp_path / "t" / "trace.json")
    events = load_trace(path)["traceEvents"]
    names = {e.get("name") for e in events if e.get("cat") == "user_annotation"}
    assert {TIMED_REGION, FINAL_SYNC} <= names
    assert any(e.get("cat") == "python_function" for e in events)
    assert find_syncs(path) == []


@pytest.mark.gpu
def test_gpu_planted_item_is_caught_and_clean_passes(tmp_path):
    import torch

    model = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")

    def clean():
        return model(x)

    def with_sync():
        y = model(x)
        return y / y.abs().max().item()  # planted sync

    assert_no_syncs(profile_region(clean, trace_path=tmp_path / "clean.json"))
    (sync,) = find_syncs(profile_region(with_sync, trace_path=tmp_path / "sync.json.gz"))
    assert sync["name"].startswith("cudaStreamSynchronize")
    assert sync["aten_op"] == "aten::_local_scalar_dense"
    assert "test_check_syncs.py" in sync["python_frame"] and "with_sync" in sync["python_frame"]


@pytest.mark.gpu
def test_gpu_sync_debug_mode_raises_and_restores():
    import torch

    from parity.checks.syncs import sync_debug_mode

    x = torch.ones(4, device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    with pytest.raises(RuntimeError, match="synchroniz"):
        with sync_debug_mode():
            x.sum().item()
    assert torch.cuda.get_sync_debug_mode() == before
