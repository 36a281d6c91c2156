"""The gate's last lines are its verdict, and its own time is held to a budget (stand-in steps, no GPU)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from parity.checks.budgets import BudgetError
from parity.gate import time_budget
from parity.gate import verdict as final_verdict
from tests.unit.test_gate_plumbing import stand_in_steps

SKIPPING_RUN = ("import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--junitxml', sys.argv[1], "
                "sys.argv[2]]))")


def _test_file(tmp_path, body: str):
    path = tmp_path / "test_standin.py"
    path.write_text("import pytest\n" + body)
    return path


def test_the_last_lines_are_the_verdict_and_name_skips_as_skips(tmp_path, monkeypatch, capsys):
    """The run a new user makes on a CPU: every GPU test skipped. The end says so, with why, not '0 failed'."""
    import parity.gate.run as gate

    reports = tmp_path / "reports"
    skipped = _test_file(tmp_path, "def test_a():\n    pytest.skip('no CUDA GPU')\n\ndef test_b():\n    pytest.skip('no CUDA GPU')\n")
    stand_in_steps(monkeypatch, tmp_path)
    commands = {"gpu": [sys.executable, "-c", SKIPPING_RUN, str(reports / "junit-gpu.xml"), str(skipped)],
                "cpu": [sys.executable, "-c", "pass"], "perf": [sys.executable, "-c", "pass"]}
    monkeypatch.setattr(gate, "pytest_commands", lambda *args, **kwargs: commands)
    assert gate.main(["--report-dir", str(reports)]) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1] == "Verdict: PASS"
    gpu_line = next(line for line in out if line.startswith("- pytest gpu"))
    assert gpu_line == "- pytest gpu: 0 passed, 0 failed, 2 skipped (ALL skipped); skipped because: 2x no CUDA GPU"
    assert any(line.startswith("- time: ") for line in out[-8:])
    assert out.index("Verdict: PASS") > max(i for i, line in enumerate(out) if line.startswith("- wall time"))


def test_a_step_over_its_budget_is_a_finding_and_with_strict_time_a_failure(tmp_path, monkeypatch, capsys):
    import parity.gate.run as gate

    budgets = tmp_path / "budgets.toml"
    budgets.write_text('[gate_time.CPU.cold]\nwhole = 600\ncpu = 0.1\nsource = "a stand-in"\n'
                       '[gate_time.CPU.warm]\nwhole = 600\ncpu = 0.1\nsource = "a stand-in"\n')
    real_load = time_budget.load
    monkeypatch.setattr(gate.time_budget, "load", lambda runner, state, path=None: real_load(runner, state, budgets))
    slow = (sys.executable, "-c", "import time; time.sleep(1)")  # the CPU layers: 1 s against 0.1 s
    stand_in_steps(monkeypatch, tmp_path, cpu=slow)
    reports = tmp_path / "reports"

    assert gate.main(["--report-dir", str(reports)]) == 0  # a finding, not a failure
    out = capsys.readouterr().out
    # the step sleeps 1 s, but on a busy machine (xdist's other worker) Python's start-up adds seconds
    assert re.search(r"- \*\*time finding\*\*: cpu took \d+\.\d s, over its 0\.1 s budget", (reports / "gate-time.md").read_text())
    assert "(budget 0.1 s: OVER" in out and out.rstrip().endswith("Verdict: PASS")
    assert json.loads((reports / "gate-time.json").read_text())["findings"][0].startswith("cpu took")

    assert gate.main(["--report-dir", str(reports), "--strict-time"]) == 1
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1] == "Verdict: FAIL"
    assert any("over its 0.1 s budget" in line and "fails the gate: --strict-time" in line for line in out)

    # a slower runner, not a regression: past the budget but within STRICT_SLACK times it, strict passes
    monkeypatch.setattr(gate.time_budget, "STRICT_SLACK", 1000.0)
    assert gate.main(["--report-dir", str(reports), "--strict-time"]) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1] == "Verdict: PASS"
    assert any("over its 0.1 s budget" in line and "(a finding: --strict-time fails past 1000x)" in line for line in out)


def test_strict_time_fails_only_past_its_slack():
    """A healthy runner 1.39x slower (measured, docs/gpu-gate.md) is a finding; 1.9x (the growth that made
    the budget) fails --strict-time; each finding names the budget itself, not the slack."""
    budget = {"whole": 180.0, "cpu": 160.0, "gpu": 120.0}
    wall = {"whole": 226.2, "cpu": 222.0, "gpu": 228.0}
    assert time_budget.over_budget(wall, budget) == [
        "gpu took 228.0 s, over its 120 s budget (1.90x)", "cpu took 222.0 s, over its 160 s budget (1.39x)",
        "whole took 226.2 s, over its 180 s budget (1.26x)"]
    assert time_budget.over_budget(wall, budget, time_budget.STRICT_SLACK) == ["gpu took 228.0 s, over its 120 s budget (1.90x)"]


def test_strict_time_without_a_budget_row_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    import parity.gate.run as gate

    stand_in_steps(monkeypatch, tmp_path)
    monkeypatch.setattr(gate, "visible_gpus", lambda: ["0"])  # CUDA_VISIBLE_DEVICES gives indices
    monkeypatch.setattr(gate, "gpu_names", lambda: ["NVIDIA B200"])  # the runner class comes from the name
    with pytest.raises(SystemExit) as exit_:
        gate.main(["--report-dir", str(tmp_path / "reports"), "--strict-time", "--workers", "1"])
    assert exit_.value.code == 2
    assert "add [gate_time.NVIDIA B200.cold] to parity/budgets.toml" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_a_resumed_cache_is_held_to_warm_plus_half_the_difference(tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text('[gate_time.H100.cold]\nwhole = 480\ngpu = 300\nsource = "s"\n'
                       '[gate_time.H100.warm]\nwhole = 180\ngpu = 100\nsource = "s"\n')
    assert time_budget.load("H100", "resumed", budgets) == {"whole": 330.0, "gpu": 200.0}
    assert time_budget.load("H200", "cold", budgets) is None


@pytest.mark.parametrize("row, problem", [
    ('whole = 480\n', "missing source"),
    ('whole = 480\ngpus = 3\nsource = "s"\n', "unknown step 'gpus'"),
    ('whole = -1\nsource = "s"\n', "whole must be a positive number"),
    ('gpu = 300\nsource = "s"\n', "needs `whole`"),
])
def test_a_malformed_time_budget_row_names_the_row_and_the_fix(tmp_path, row, problem):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text("[gate_time.H100.cold]\n" + row)
    with pytest.raises(BudgetError, match=r"\[gate_time.H100.cold\]: " + problem):
        time_budget.load("H100", "cold", budgets)


def test_the_shipped_budgets_hold_the_issue_targets():
    """H100: cold <= 8 min and warm <= 3 min for the whole run, every step within the whole."""
    for state, whole in (("cold", 480), ("warm", 180)):
        budget = time_budget.load("H100", state)
        assert budget["whole"] <= whole and all(seconds <= budget["whole"] for seconds in budget.values())


def test_a_check_line_gives_the_worst_gate_of_the_report(tmp_path):
    report = {"verdict": "FAIL", "stages": [
        {"stage": "fp32", "verdict": "pass", "passed": True, "gates": [
            {"metric": "mask_iou_mean", "value": 0.9999, "ratio": 0.01, "gated": True}]},
        {"stage": "nt", "verdict": "fail", "passed": False, "gates": [
            {"metric": "score_max_abs_err", "value": 0.72, "ratio": 1.44, "gated": True},
            {"metric": "mask_iou_p5", "value": 0.1, "ratio": 9.0, "gated": False}]}]}
    (tmp_path / "report.json").write_text(json.dumps(report))
    line = final_verdict.check_line("python -m parity check", tmp_path / "report.json", 1)
    assert line == ("- python -m parity check: FAIL, 1 of 2 stages pass; worst: nt score_max_abs_err 0.7200 "
                    "(1.44x its limit); failed: nt")
    assert "no report (exit 2: bad input" in final_verdict.check_line("x", tmp_path / "missing.json", 2)


def test_a_run_on_a_killed_runs_cache_is_held_to_the_resumed_budget(tmp_path, monkeypatch, capsys):
    import parity.gate.run as gate
    from parity.gate import compile_cache

    budgets = tmp_path / "budgets.toml"
    budgets.write_text('[gate_time.CPU.cold]\nwhole = 500\nsource = "s"\n[gate_time.CPU.warm]\nwhole = 100\nsource = "s"\n')
    real_load = time_budget.load
    monkeypatch.setattr(gate.time_budget, "load", lambda runner, state, path=None: real_load(runner, state, budgets))
    stand_in_steps(monkeypatch, tmp_path)
    folder = tmp_path / "cache" / "left-by-a-killed-run"
    folder.mkdir(parents=True)
    monkeypatch.setattr(gate.compile_cache, "activate", lambda: compile_cache.CacheFolder(folder, False, False, True))
    assert gate.main(["--report-dir", str(tmp_path / "reports")]) == 0
    table = (tmp_path / "reports" / "gate-time.md").read_text()
    assert "runner class CPU, resumed cache" in table and "(budget 300 s: within)" in table  # 100 + (500 - 100) / 2
