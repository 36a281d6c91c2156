"""A stage whose switch did not run is "not exercised", never "pass"; --require-gpu fails it; no stale reports."""

from __future__ import annotations

import pytest
import torch

import samfast

from parity.checks.exercised import watch_switches
from parity.cli import main
from parity.golden import manifest as golden_io
from parity.golden.data import load_dataset
from parity.report.verdicts import REPORT_FILES
from parity.tasks.point.runner import make_golden, run_check
from parity.tasks.source import ModelSource
from samfast import kernels


@pytest.fixture(scope="module")
def one_scene():
    return load_dataset("scenes", limit=1)


@pytest.fixture(scope="module")
def golden(one_scene, tmp_path_factory):
    return make_golden(ModelSource("vit_tiny"), one_scene, device="cpu", root=tmp_path_factory.mktemp("golden"))


def _check(golden, report_dir, *extra):
    return main(["check", "--model", "vit_tiny", "--seed", "0", "--data", "scenes", "--limit", "1", "--device", "cpu",
                 "--stages", "fp32+triton", "--golden", str(golden), "--report-dir", str(report_dir), *extra])


def test_kernel_that_fell_back_is_not_exercised_and_require_gpu_fails_it(golden, tmp_path, monkeypatch, capsys):
    """Planted: fp32+triton on a CPU without TRITON_INTERPRET, where the kernel falls back on every call."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert _check(golden, tmp_path / "plain") == 0
    report = (tmp_path / "plain" / "report.md").read_text()
    assert "**NOT EXERCISED**" in report and "| fp32+triton | NOT EXERCISED |" in report
    assert "not exercised: a Triton kernel fell back to its reference path" in report
    assert "without TRITON_INTERPRET=1" in report
    junit = (tmp_path / "plain" / "junit.xml").read_text()
    assert 'skipped="1"' in junit and 'failures="0"' in junit

    assert _check(golden, tmp_path / "required", "--require-gpu") == 1
    report = (tmp_path / "required" / "report.md").read_text()
    assert "**FAIL**" in report and "FAIL: not exercised (--require-gpu)" in report
    assert 'failures="1"' in (tmp_path / "required" / "junit.xml").read_text()


def test_compile_that_ran_eagerly_is_not_exercised(golden, one_scene, tmp_path, monkeypatch):
    """Planted: TORCHDYNAMO_DISABLE=1 turns torch.compile into a silent no-op: the compile stage runs eagerly.
    batch_size=1: the compile stage pads every encoder batch to its static batch (8 by default), so the one
    scene would run eagerly as eight images; the proof reads dynamo's counters, whatever the batch."""
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    (result,) = run_check(ModelSource("vit_tiny"), one_scene, ["fp32+compile"], data_args="--data scenes --limit 1",
                          device="cpu", batch_size=1, golden=golden, report_dir=tmp_path)[0]
    assert not result.failures  # the accuracy gates pass ...
    assert result.verdict == "not exercised" and not result.blocks  # ... yet it is no pass
    assert "torch.compile compiled no graph" in result.not_exercised[0]


def test_switches_that_ran_are_exercised(monkeypatch):
    """The other side of both checks: a real compile and a kernel served by the Triton interpreter count."""
    with watch_switches(frozenset({"compile"})) as used:
        used.watch(samfast.build_sam("vit_tiny", device="cpu"))  # the compile proof reads dynamo's counters only
        torch.compile(lambda x: (x * 2).sin(), backend="eager", fullgraph=True)(torch.ones(3))
    assert used.graphs_compiled == 1 and used.not_exercised == []

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(3, 1, 1, 16, 16, generator=gen)
    rel_h, rel_w = torch.randn(1, 1, 16, 4, generator=gen), torch.randn(1, 1, 16, 4, generator=gen)
    with watch_switches(frozenset({"triton"})) as used:
        used.watch(samfast.build_sam("vit_tiny", device="cpu", stages="fp32+triton"))
        kernels.relpos_attention(qkv, rel_h, rel_w)
    assert used.kernel_fallbacks == {} and used.not_exercised == []


def test_sdpa_switch_that_did_nothing_is_not_exercised_not_pass(golden, one_scene, tmp_path, monkeypatch):
    """Planted (a reviewer's trick): the sdpa switch leaves every attention module on the math path,
    which gives fp32's numbers: the gates pass, the proof does not."""
    apply = samfast.build.apply_stages

    def sdpa_does_nothing(model, switches):
        apply(model, switches - {"sdpa"})
        model.switches = switches

    monkeypatch.setattr(samfast.build, "apply_stages", sdpa_does_nothing)
    (result,) = run_check(ModelSource("vit_tiny"), one_scene, ["fp32+sdpa"], data_args="--data scenes --limit 1",
                          device="cpu", golden=golden, report_dir=tmp_path)[0]
    assert not result.failures and result.verdict == "not exercised"
    assert result.not_exercised[0].startswith("sdpa: 11 of 11 attention modules stayed on the math path: ")
    assert "  - not exercised: sdpa: 11 of 11 attention modules" in (tmp_path / "report.md").read_text()


def test_stale_reports_are_removed_before_a_check(one_scene, tmp_path):
    """A check that stops on bad input leaves no report of the previous run (e.g. a PASS junit.xml) behind."""
    for name in REPORT_FILES:
        (tmp_path / name).write_text('<testsuite failures="0"/>')
    with pytest.raises(golden_io.GoldenMissing):
        run_check(ModelSource("vit_tiny"), one_scene, ["fp32"], data_args="--data scenes --limit 1", device="cpu",
                  golden=tmp_path / "no-golden", report_dir=tmp_path)
    assert [name for name in REPORT_FILES if (tmp_path / name).exists()] == []
