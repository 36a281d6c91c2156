"""Tasks are plug-ins of one shape (parity/tasks/task.py): the CLI knows them only through the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from parity import cli
from parity.report.verdicts import REPORT_FILES
from parity.tasks import registry
from parity.tasks.task import Task
from samfast.stages import SWITCHES

REPO = Path(__file__).resolve().parents[2]


def _test_functions(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("task", registry.TASKS.values(), ids=lambda t: t.name)
def test_each_task_declares_its_golden_switches_and_planted_defects(task):
    assert task.golden_files and all(isinstance(name, str) for name in task.golden_files)
    assert task.switches <= set(SWITCHES) and "fp32" in task.switches
    assert task.planted_defects, f"task {task.name} names no test that shows its comparison failing"
    for node_id in task.planted_defects:
        file, _, function = node_id.partition("::")
        assert (REPO / file).is_file(), node_id
        assert function in _test_functions(REPO / file), f"{node_id}: no such test"


def test_amg_reads_every_switch_but_nt():
    assert set(SWITCHES) - registry.TASKS["amg"].switches == {"nt"}
    assert registry.TASKS["point"].switches == set(SWITCHES)


def test_a_flag_of_another_task_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check", "--points-per-side", "4"])
    assert exit_.value.code == 2
    assert "--points-per-side go with --task amg" in capsys.readouterr().err


def test_a_one_process_task_refuses_nproc(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["golden", "--task", "amg", "--nproc", "2"])
    assert exit_.value.code == 2
    assert "--task amg runs in one process" in capsys.readouterr().err


def test_a_new_task_plugs_in_through_the_registry_alone(monkeypatch, tmp_path, capsys):
    """A stand-in task: the CLI offers it, parses its own flag, and calls its golden and check."""
    calls = []

    def add_arguments(parser):
        parser.add_argument("--frames", type=int)
        return ["frames"]

    def make_golden(args, source, dataset, device, ranks):
        calls.append(("golden", args.frames, source.model_type, len(dataset.samples)))
        return "stand-in golden written"

    def run_check(args, source, dataset, data_args, stages, device, ranks):
        calls.append(("check", tuple(stages)))
        for name in REPORT_FILES:  # what every task's report writes
            (tmp_path / name).write_text("stand-in report\n")
        return [], {name: tmp_path / name for name in REPORT_FILES}

    standin = Task(name="standin", help="a stand-in", golden_files=("frames.json.gz",),
                   add_arguments=add_arguments, make_golden=make_golden, run_check=run_check,
                   planted_defects=("tests/unit/test_tasks.py::test_a_new_task_plugs_in_through_the_registry_alone",))
    monkeypatch.setattr(cli, "TASKS", {**registry.TASKS, "standin": standin})
    common = ["--data", "scenes:1", "--device", "cpu"]
    assert cli.main(["golden", "--task", "standin", "--frames", "7", *common, "--golden-root", str(tmp_path)]) == 0
    assert cli.main(["check", "--task", "standin", *common, "--stages", "fp32", "--report-dir", str(tmp_path)]) == 0
    assert calls == [("golden", 7, "vit_tiny", 1), ("check", ("fp32",))]
    assert "stand-in golden written" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # and its flag is its own
        cli.main(["check", "--frames", "3"])



@pytest.mark.parametrize("task", registry.TASKS.values(), ids=lambda t: t.name)
def test_each_task_has_embedded_checks_the_gate_runs_and_nox_remakes(task):
    from parity.gate.run import EMBEDDED_CHECKS, GPU_CHECKS

    assert task.embedded, f"task {task.name} has no embedded check: the gate would never run it"
    for embedded in task.embedded:
        assert EMBEDDED_CHECKS[embedded.step].args == embedded.check_args(gpu=False)
        assert GPU_CHECKS[embedded.step].args == embedded.golden
        for args in (embedded.golden, embedded.check_args(gpu=False), embedded.golden_args()):
            named = args[args.index("--task") + 1] if "--task" in args else registry.DEFAULT_TASK
            assert named == task.name, f"{embedded.step}: {args} run --task {named}, not {task.name}"
    noxfile = (REPO / "noxfile.py").read_text()
    assert "parity.tasks.registry" in noxfile and "embedded import" not in noxfile


def test_a_new_tasks_embedded_check_becomes_a_gate_step(monkeypatch):
    from parity.gate import run as gate
    from parity.tasks.task import EmbeddedCheck

    standin = Task(name="standin", help="a stand-in", golden_files=("frames.json.gz",), add_arguments=lambda parser: [],
                   make_golden=None, run_check=None, planted_defects=(), report_folder="standin",
                   embedded=(EmbeddedCheck("check-standin", "python -m parity check --task standin",
                                           ("--task", "standin"), ("--task", "standin", "--stages", "fp32")),))
    monkeypatch.setattr(gate, "TASKS", {**registry.TASKS, "standin": standin})
    cpu, gpu = gate.check_steps(gpu=False)["check-standin"], gate.check_steps(gpu=True)["check-standin"]
    assert cpu.args == ("--task", "standin", "--stages", "fp32") and gpu.args == ("--task", "standin")
    assert cpu.report(Path("reports")) == Path("reports/standin/report.json")
