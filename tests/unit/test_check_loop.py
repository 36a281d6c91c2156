"""The one check loop (parity/tasks/check.py) on a stand-in task: what every task's check gets from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from parity.compare.gates import Gate, StageResult
from parity.golden.manifest import IDENTITY_FIELDS, GoldenMismatch
from parity.report.verdicts import REPORT_FILES
from parity.tasks import check
from parity.tasks.check import GoldenRef, TaskCheck

IDENTITY = {key: f"stand-in {key}" for key in IDENTITY_FIELDS}


@dataclass
class StandIn(TaskCheck):
    """A task whose model is one number: its output is the weight, the golden's is 1."""

    weight: dict[str, float] = field(default_factory=dict)  # stage -> the built model's weight (default 1)
    manifest: dict = field(default_factory=lambda: dict(IDENTITY))
    calls: list[str] = field(default_factory=list)

    def locate_golden(self) -> GoldenRef:
        self.calls.append("locate_golden")
        return GoldenRef(Path("golden/stand-in"), "python -m parity golden --task standin", dict(IDENTITY))

    def read_golden(self, folder, regenerate):
        self.calls.append("read_golden")
        return self.manifest, 1.0

    def build(self, stage):
        self.calls.append(f"build {stage}")
        if self.weight.get(stage) is None and stage in self.weight:
            raise RuntimeError("no such build here")
        model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.constant_(model.weight, self.weight.get(stage, 1.0))
        return model

    def produce(self, model, stage, limits):
        return float(model(torch.ones(1, 1)).detach())

    def compare(self, stage, outputs, golden, limits):
        error = abs(outputs - golden)
        return StageResult(stage, [Gate("score_max_abs_err", error, limits["max_score_abs_err"], "max", True)],
                           {"error": error}, [{"error": error}], worst_masks={0: (golden, outputs)})

    def pictures(self, result, outputs, golden):
        self.calls.append(f"pictures {result.stage}")
        return {0: b"png"}

    def header(self, ref, manifest):
        return {"golden": str(ref.folder)}

    def write_reports(self, folder, header, results):
        folder.mkdir(parents=True, exist_ok=True)
        for name in REPORT_FILES:
            (folder / name).write_text(f"{header['golden']}: {[r.verdict for r in results]}\n")
        return {name: folder / name for name in REPORT_FILES}

    def finish(self):
        self.calls.append("finish")


def test_each_stage_is_built_run_compared_and_reported(tmp_path):
    task = StandIn()
    results, paths = check.run_check(task, ["fp32"], report_dir=tmp_path)
    (result,) = results
    assert result.verdict == "pass" and result.summary["kernel_fallbacks"] == {}
    assert result.worst_masks == {} and result.pictures == {}  # no picture of a passing stage
    assert task.calls == ["locate_golden", "read_golden", "build fp32", "finish"]
    assert paths["report.md"].read_text() == "golden/stand-in: ['pass']\n"


def test_planted_defect_a_stage_off_the_golden_fails_with_its_pictures(tmp_path):
    task = StandIn(weight={"fp32": 1.5})
    (off,), paths = check.run_check(task, ["fp32"], report_dir=tmp_path)
    assert off.verdict == "fail" and {g.metric for g in off.failures} == {"score_max_abs_err"}
    assert off.pictures == {0: b"png"} and "pictures fp32" in task.calls
    assert paths["report.md"].read_text() == "golden/stand-in: ['fail']\n"


def test_a_stage_that_cannot_run_fails_alone(tmp_path):
    results, _ = check.run_check(StandIn(weight={"fp32+nt": None}), ["fp32+nt", "fp32"], report_dir=tmp_path)
    assert [r.verdict for r in results] == ["error", "pass"]
    assert results[0].error == "RuntimeError: no such build here"


def test_an_error_the_task_does_not_accept_stops_the_check(tmp_path):
    class Strict(StandIn):
        def stage_error(self, err):
            return None

    with pytest.raises(RuntimeError, match="no such build here"):
        check.run_check(Strict(weight={"fp32": None}), ["fp32"], report_dir=tmp_path)


def test_a_golden_of_another_identity_is_refused_and_no_earlier_report_survives(tmp_path):
    (tmp_path / "report.md").write_text("PASS from an earlier run\n")
    task = StandIn(manifest={**IDENTITY, "checkpoint_sha256": "another"})
    with pytest.raises(GoldenMismatch, match="python -m parity golden --task standin"):
        check.run_check(task, ["fp32"], report_dir=tmp_path)
    assert not (tmp_path / "report.md").exists()
    assert not any(call.startswith("build") for call in task.calls)


def test_stages_the_task_refuses_stop_the_check_before_any_work(tmp_path):
    class Refusing(StandIn):
        def refuse_stages(self, stages):
            raise ValueError(f"not built: {stages}")

    task = Refusing()
    with pytest.raises(ValueError, match="not built"):
        check.run_check(task, ["fp32"], report_dir=tmp_path)
    assert task.calls == []
