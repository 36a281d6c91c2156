"""The GPU gate's plumbing on the CPU: compile-cache trust, xdist GPU assignment, the timing table, the model cache."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from parity.gate import compile_cache, run_order
from parity.gate import timing as gate_time
from parity.gate.devices import WorkerAssignmentError, cpu_model, gpu_for_worker, visible_gpus
from parity.gate.models import ModelCache, SharedModelMutated, make_key
from parity.gate.allocator import HEAP_ENV
from parity.gate.run import (
    COVERED_BY_CHECKS,
    COVERED_BY_GPU_CHECKS,
    MAX_CPU_WORKERS,
    PERF_CORES,
    PERF_EARLY_MIN_CORES,
    Background,
    GateUsageError,
    _timed,
    check_env,
    choose_cpu_workers,
    choose_perf_early,
    choose_workers,
    cpu_layers_env,
    left_to_checks,
    pytest_commands,
    spare_cores,
    split_cores,
    verdict,
)
from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]
KEY = {"torch": "2.11.0", "triton": "3.5.0", "cuda": "12.8", "gpu": "NVIDIA H100 80GB HBM3"}


# --- the compile cache: tests/unit/test_compile_cache.py ------------------------------------------


def test_the_time_table_names_the_cpu_model(tmp_path):
    """Runners of one GPU kind differ by their CPU: the time table names it, or says it could not."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
    assert cpu_model(cpuinfo) == "Intel(R) Xeon(R) Platinum 8480+"
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd\n")  # an Arm kernel names no model
    assert cpu_model(cpuinfo) == "unknown CPU"
    assert cpu_model(tmp_path / "missing") == "unknown CPU"


def test_each_worker_gets_its_own_gpu():
    assert [gpu_for_worker(f"gw{k}", ["0", "1"]) for k in range(2)] == ["0", "1"]
    assert gpu_for_worker("gw1", ["3", "GPU-uuid-7"]) == "GPU-uuid-7"  # the K-th *visible* device


def test_more_workers_than_gpus_is_refused():
    with pytest.raises(WorkerAssignmentError, match="-n 2 or fewer"):
        gpu_for_worker("gw2", ["0", "1"])
    with pytest.raises(WorkerAssignmentError, match="worker id"):
        gpu_for_worker("main", ["0"])


def test_without_gpus_workers_share_the_cpu():
    assert gpu_for_worker("gw5", []) is None


def test_visible_gpus_follow_cuda_visible_devices():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_workers_per_gpu_and_never_more():
    assert choose_workers(None, ["0", "1"], have_xdist=True)[0] == 2
    assert choose_workers(None, ["0", "1"], have_xdist=True, per_gpu=3)[0] == 6
    assert choose_workers(None, ["0", "1"], have_xdist=False, per_gpu=3)[0] == 1  # the gate runs without xdist
    assert choose_workers(None, ["0"], have_xdist=True)[0] == 1
    assert choose_workers(None, [], have_xdist=True, per_gpu=3)[0] == 1  # no GPU: the gpu tests skip in one process
    with pytest.raises(GateUsageError, match="at most 2"):
        choose_workers(4, ["0", "1"], have_xdist=True)


def test_several_workers_share_a_gpu_only_when_allowed():
    assert [gpu_for_worker(f"gw{k}", ["0", "1"], per_gpu=2) for k in range(4)] == ["0", "1", "0", "1"]
    with pytest.raises(WorkerAssignmentError, match="no GPU of its own"):
        gpu_for_worker("gw4", ["0", "1"], per_gpu=2)


def test_cpu_layers_get_the_cores_the_other_steps_leave_and_no_gpu():
    # all cores but one (the gate's): the CPU layers run niced beside the GPU-layer workers (5af7a8f)
    assert spare_cores(14) == 13
    assert spare_cores(3) == 2
    assert spare_cores(2) == 2  # two cores: both (one held back idled half the machine)
    assert spare_cores(1) == 1
    assert choose_cpu_workers(None, spare=10, have_xdist=True) == 10
    assert choose_cpu_workers(None, spare=1, have_xdist=True) == 1
    assert choose_cpu_workers(None, spare=120, have_xdist=True) == MAX_CPU_WORKERS
    assert choose_cpu_workers(None, spare=10, have_xdist=False) == 1
    assert choose_cpu_workers(3, spare=1, have_xdist=True) == 3  # asked for
    with pytest.raises(GateUsageError, match="needs pytest-xdist"):
        choose_cpu_workers(3, spare=10, have_xdist=False)
    env = cpu_layers_env(4, spare=8, environ={"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/bin"})
    assert env == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2", "PATH": "/bin", **HEAP_ENV}
    assert cpu_layers_env(10, spare=1, environ={})["OMP_NUM_THREADS"] == "1"


def test_a_background_step_reports_when_it_ended_not_when_it_was_waited_for(tmp_path):
    """The gate waits for its steps one after another: a step that ended while the gate waited for
    another must report its own seconds (the first H100 table gave every step the slowest one's)."""
    release = tmp_path / "release"
    held = Background([sys.executable, "-c", "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.01)",
                       str(release)], dict(os.environ), tmp_path / "held.log")
    quick = Background([sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "quick.log")
    while quick.process.poll() is None:
        time.sleep(0.01)
    quick_ended_by = time.perf_counter() - quick.start  # it ended before this moment...
    release.touch()  # ...and the held step after it
    assert held.wait()[0] == 0
    code, seconds = quick.wait()
    assert code == 0 and seconds <= quick_ended_by


def test_perf_early_is_the_default_only_with_a_gpu_and_cores_to_spare():
    assert choose_perf_early(None, ["H100"], cores=16) is True
    assert choose_perf_early(None, ["H100"], cores=PERF_EARLY_MIN_CORES - 1) is False
    assert choose_perf_early(None, [], cores=64) is False  # no GPU: the perf rows skip, nothing to time early
    assert choose_perf_early(False, ["H100"], cores=16) is False  # --no-perf-early
    assert choose_perf_early(True, [], cores=2) is True  # asked for: split_cores then says why it cannot


def test_perf_early_keeps_cores_of_its_own_and_a_pinned_step_runs_only_on_its_cores(tmp_path):
    perf, others = split_cores({0, 1, 2, 3, 4, 5}, perf_early=True)
    assert len(perf) == PERF_CORES and perf.isdisjoint(others) and perf | others == {0, 1, 2, 3, 4, 5}
    assert split_cores({0, 1, 2, 3}, perf_early=False) == (None, None)  # the default pins nothing
    with pytest.raises(GateUsageError, match="needs more than that"):
        split_cores(set(range(PERF_CORES)), perf_early=True)
    # a pinned child (and what it starts) runs only on the cores it was given
    mine = sorted(os.sched_getaffinity(0))
    report = "import os, sys; open(sys.argv[1], 'w').write(repr(sorted(os.sched_getaffinity(0))))"
    step = Background([sys.executable, "-c", report, str(tmp_path / "bg")], dict(os.environ), tmp_path / "bg.log", {mine[0]})
    assert step.wait()[0] == 0 and (tmp_path / "bg").read_text() == repr([mine[0]])
    assert _timed([sys.executable, "-c", report, str(tmp_path / "fg")], cores={mine[-1]})[0] == 0
    assert (tmp_path / "fg").read_text() == repr([mine[-1]])
    assert _timed([sys.executable, "-c", report, str(tmp_path / "free")])[0] == 0
    assert (tmp_path / "free").read_text() == repr(mine)


def stand_in_steps(monkeypatch, tmp_path, cpu=(sys.executable, "-c", "pass"), perf=(sys.executable, "-c", "pass"),
                   gpu=(sys.executable, "-c", "pass")):
    """parity.gate.run with stand-in pytest steps, no checks, no GPU and a compile cache of its own."""
    import parity.gate.run as gate

    monkeypatch.setattr(gate, "pytest_commands", lambda *args, **kwargs: {
        "gpu": list(gpu), "cpu": list(cpu), "perf": list(perf)})
    monkeypatch.setattr(gate, "EMBEDDED_CHECKS", {})
    monkeypatch.setattr(gate, "visible_gpus", lambda: [])
    activate = compile_cache.activate  # this process's environment left alone
    monkeypatch.setattr(gate.compile_cache, "activate", lambda: activate(tmp_path / "cache", KEY, env={}))
    monkeypatch.setattr(gate.vec_isa, "settle", lambda folder, may_write: "CPU vector ISA: left to each step")
    monkeypatch.setenv(run_order.TIMES_ENV, "")  # the gate sets it for its steps: undone after the test


def test_cpu_workers_count_the_cores_this_process_may_use_not_the_machines(tmp_path, monkeypatch, capsys):
    """A runner container limited to 8 of a host's 64 cores must not start 16 CPU-layer workers."""
    import parity.gate.run as gate

    pytest.importorskip("xdist", reason="without pytest-xdist the CPU layers run in one process")
    stand_in_steps(monkeypatch, tmp_path)
    monkeypatch.setattr(gate.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(gate.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(gate, "choose_workers", lambda *args: (1, "stand-in"))
    assert gate.main(["--report-dir", str(tmp_path / "reports")]) == 0
    # 8 cores - 1 for the gate = 7 (with the host's 64 it was 16)
    assert "pytest workers: 1 for the gpu tests (stand-in), 7 for the others" in capsys.readouterr().out


def test_perf_early_times_perf_while_the_cpu_layers_still_run(tmp_path, monkeypatch):
    """The gate's order with --perf-early, with stand-in steps: the CPU layers wait until perf has
    finished, which they can only see if perf runs while they do. Until perf starts they have every
    core; then they, a process they started and a thread of theirs are moved off perf's core."""
    import parity.gate.run as gate

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores to give perf one of its own")
    cores = sorted(os.sched_getaffinity(0))
    last = cores[-1]
    perf_done, cpu_saw = tmp_path / "perf-done", tmp_path / "cpu-saw.json"
    cpu_layers = tmp_path / "cpu_layers.py"
    cpu_layers.write_text(textwrap.dedent("""\
        import json, os, subprocess, sys, threading, time
        perf_done, out = sys.argv[1:3]

        def wait_for_perf():
            deadline = time.time() + 120
            while not os.path.exists(perf_done) and time.time() < deadline:
                time.sleep(0.02)
            return sorted(os.sched_getaffinity(0))  # this thread's cores

        if len(sys.argv) == 4:  # the child
            print(json.dumps(wait_for_perf()))
            sys.exit()
        started_on = sorted(os.sched_getaffinity(0))
        open(perf_done + ".cpu-started", "w").close()  # the GPU step's stand-in waits for this
        child = subprocess.Popen([sys.executable, __file__, perf_done, out, "child"], stdout=subprocess.PIPE, text=True)
        seen = {}
        thread = threading.Thread(target=lambda: seen.update(thread=wait_for_perf()))
        thread.start()
        cores = wait_for_perf()
        thread.join()
        json.dump({"perf_done_first": os.path.exists(perf_done), "started_on": started_on, "cores": cores,
                   "child": json.loads(child.communicate()[0]), "thread": seen["thread"], "niceness": os.nice(0)},
                  open(out, "w"))
        """))
    perf = "import json, os, sys; json.dump(sorted(os.sched_getaffinity(0)), open(sys.argv[1], 'w'))"
    wait_for_cpu = ("import os, sys, time\ndeadline = time.time() + 120\n"
                    "while not os.path.exists(sys.argv[1]) and time.time() < deadline: time.sleep(0.02)")
    stand_in_steps(monkeypatch, tmp_path, cpu=[sys.executable, str(cpu_layers), str(perf_done), str(cpu_saw)],
                   perf=[sys.executable, "-c", perf, str(perf_done)],
                   gpu=[sys.executable, "-c", wait_for_cpu, f"{perf_done}.cpu-started"])
    monkeypatch.setattr(gate, "split_cores", lambda available, early: ({last}, set(cores) - {last}) if early else (None, None))
    assert gate.main(["--perf-early", "--report-dir", str(tmp_path / "reports")]) == 0
    saw = json.loads(cpu_saw.read_text())
    # the CPU layers yield the CPU to the GPU layers (which set a cold run's wall)
    niceness = min(19, os.nice(0) + gate.CPU_LAYERS_NICENESS)
    others = [c for c in cores if c != last]
    assert saw == {"perf_done_first": True, "started_on": cores, "cores": others, "child": others, "thread": others,
                   "niceness": niceness}
    assert json.loads(perf_done.read_text()) == [last]
    table = (tmp_path / "reports" / "gate-time.md").read_text()
    assert "of its own while the CPU layers finished" in table
    # what each step's processes used, one line under the table (cpu_use.StepCpu)
    assert re.search(r"CPU core-seconds by step .*: pytest cpu \d+ \(\d+\.\d cores over its \d+ s\), pytest gpu", table)
    # which machine: runners of one GPU kind differ by their CPU
    gpu_models = gate.gpu_names() if gate.visible_gpus() else []  # the GPUs the gate uses, as its runner class
    # under the gate this test's own process is moved off perf's cores once, perhaps while it runs: either count
    counts = {len(cores), len(os.sched_getaffinity(0))}
    assert any(f"runner: {', '.join(gpu_models) or 'no GPU'}; {cpu_model()}, {n} cores" in table for n in counts), table


@pytest.mark.parametrize("asked", [None, "ACTIVE"])
def test_the_untimed_gpu_steps_idle_openmp_threads_sleep_and_perf_runs_as_users_do(tmp_path, monkeypatch, asked):
    """OMP_WAIT_POLICY=PASSIVE for the GPU layers (unless the caller set it): their idle OpenMP threads spun
    1418 core-seconds of a warm H100 gate. perf keeps the caller's environment (its timings compare with
    users' runs)."""
    import parity.gate.run as gate

    if asked is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", asked)
    record = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get('OMP_WAIT_POLICY', 'unset'))"
    stand_in_steps(monkeypatch, tmp_path, gpu=[sys.executable, "-c", record, str(tmp_path / "gpu")],
                   perf=[sys.executable, "-c", record, str(tmp_path / "perf")])
    assert gate.main(["--no-perf-early", "--report-dir", str(tmp_path / "reports")]) == 0
    assert (tmp_path / "gpu").read_text() == (asked or "PASSIVE")
    assert (tmp_path / "perf").read_text() == (asked or "unset")
    assert gate.untimed_gpu_env(check_env({}))["OMP_WAIT_POLICY"] == "PASSIVE"  # the checks' environment
    table = (tmp_path / "reports" / "gate-time.md").read_text()
    assert f"the GPU layers and the checks: OMP_WAIT_POLICY={asked or 'PASSIVE'}; perf: {asked or 'OpenMP default'}" in table


def test_with_a_gpu_perfs_rows_compile_beside_the_gpu_layers_and_perf_starts_after(tmp_path, monkeypatch):
    """The perf warm-up (pytest tests/perf --perf-warm-up) runs beside the GPU layers, untimed, and perf
    starts only once it has ended (so its compiles are cache hits); on a warm cache, or without a GPU,
    there is none."""
    import parity.gate.run as gate

    order = tmp_path / "order"
    note = "import sys, time; time.sleep(float(sys.argv[2])); open(sys.argv[1], 'a').write(sys.argv[3] + '\\n')"
    stand_in_steps(monkeypatch, tmp_path, gpu=[sys.executable, "-c", note, str(order), "0", "gpu"],
                   perf=[sys.executable, "-c", note, str(order), "0", "perf"])
    commands = gate.pytest_commands
    monkeypatch.setattr(gate, "pytest_commands", lambda *args, **kwargs: {
        **commands(), "perf warm-up": [sys.executable, "-c", note, str(order), "1", "perf warm-up"]})
    monkeypatch.setattr(gate, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr(gate, "gpu_names", lambda: ["NVIDIA H100 80GB HBM3"])
    monkeypatch.setattr(gate, "GPU_CHECKS", {})
    entry = tmp_path / "cache" / compile_cache.key_folder_name(KEY) / "inductor" / "entry.py"
    entry.parent.mkdir(parents=True)
    entry.write_text("x = 1\n")  # a killed run's finished entry: this run resumes it (and seals it)
    assert gate.main(["--no-perf-early", "--report-dir", str(tmp_path / "reports")]) == 0
    assert order.read_text().split("\n")[:3] == ["gpu", "perf warm-up", "perf"]  # gpu ended first: the warm-up slept
    table = (tmp_path / "reports" / "gate-time.md").read_text()
    assert "wall time, perf warm-up:" in table and "perf's rows compiled beside the GPU layers first" in table
    assert "exit 0, log perf-warm-up.log" in table
    # the next run finds the cache warm: perf only loads its graphs, so nothing is warmed up
    order.unlink()
    assert gate.main(["--no-perf-early", "--report-dir", str(tmp_path / "reports")]) == 0
    assert order.read_text().split("\n")[:2] == ["gpu", "perf"]
    assert "perf's rows not warmed up beside the GPU layers (warm cache)" in (tmp_path / "reports" / "gate-time.md").read_text()


@pytest.mark.parametrize("argv", [["--workers-per-gpu", "0"], ["--workers", "5"]], ids=["parser", "combination"])
def test_a_refused_command_line_exits_2_before_touching_cache_or_reports(tmp_path, monkeypatch, capsys, argv):
    """Exit 2 means bad input, and a bad argument must not cost the runner its warm cache: the gate
    unseals the cache while it runs, so options are checked before it is opened."""
    import parity.gate.run as gate

    def touched(*args, **kwargs):
        raise AssertionError("the compile cache was opened for a command line that is refused")

    monkeypatch.setattr(gate.compile_cache, "activate", touched)
    monkeypatch.setattr(gate, "visible_gpus", lambda: ["0"])  # 1 GPU: at most 4 workers
    reports = tmp_path / "reports"
    with pytest.raises(SystemExit) as exit_:
        gate.main([*argv, "--report-dir", str(reports)])
    assert exit_.value.code == 2 and not reports.exists()
    assert ("at least 1" if argv[0] == "--workers-per-gpu" else "at most 4") in capsys.readouterr().err


def test_checks_compile_in_mode_default_unless_told_otherwise():
    assert check_env({"PATH": "/bin"}) == {"SAMFAST_COMPILE_MODE": "default", "PATH": "/bin", **HEAP_ENV}
    assert check_env({"SAMFAST_COMPILE_MODE": "max-autotune"})["SAMFAST_COMPILE_MODE"] == "max-autotune"


def _selection(cmd: list[str]) -> tuple[str, ...]:
    """What one of the gate's pytest commands selects: its arguments without the gate's own options."""
    keep, skip = [], False
    for arg in cmd[3:]:
        if skip:
            skip = False
        elif arg in ("--gate-time", "--junitxml", "-n", "--dist"):  # options with a value
            skip = True
        elif arg != "--no-loadscope-reorder":
            keep.append(arg)
    return tuple(keep)


_COLLECT_EACH = """
import json, sys, pytest
class Grab:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]
found = []
for args in json.loads(sys.argv[1]):
    grab = Grab()
    assert pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args], plugins=[grab]) == 0, args
    found.append(grab.ids)
print(json.dumps(found))
"""


def _collect(selections: list[tuple[str, ...]]) -> dict[tuple[str, ...], set[str]]:
    """The test ids each selection collects, all in one pytest process: torch and the test modules are
    imported once (a collection in a process of its own costs ~10 s; five of them were 88 s of CI)."""
    done = subprocess.run([sys.executable, "-c", _COLLECT_EACH, json.dumps(selections)],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    return {selection: set(ids) for selection, ids in zip(selections, json.loads(done.stdout.splitlines()[-1]))}


def test_the_gates_pytest_runs_split_the_suite_without_losing_a_test(tmp_path):
    """gpu + cpu + perf select every test exactly once (running them side by side drops nothing) but the
    tests a check step runs anyway, which are left to that step: COVERED_BY_CHECKS on any machine, and
    COVERED_BY_GPU_CHECKS with a GPU."""
    args = SimpleNamespace(require_gpu=False, perf_matrix=False, perf_args="")
    commands_with = {gpu_checks: pytest_commands(args, tmp_path, workers=2, cpu_workers=3, gpu_checks=gpu_checks)
                     for gpu_checks in (False, True)}
    selections = {("tests",)} | {_selection(cmd) for commands in commands_with.values() for cmd in commands.values()}
    collected = _collect(sorted(selections))
    everything = collected[("tests",)]
    for gpu_checks, commands in commands_with.items():
        assert commands["gpu"][-5:] == ["-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder"] and "-n" not in commands["perf"]
        # perf's warm-up compiles what perf times: a subset of perf, not a share of the suite
        warm_up = collected[_selection(commands.pop("perf warm-up"))]
        runs = {name: collected[_selection(cmd)] for name, cmd in commands.items()}
        assert warm_up and warm_up <= runs["perf"] and all("::test_stage_within_budget[" in t for t in warm_up)
        covered = set(left_to_checks(gpu_checks))
        assert covered <= everything and set(COVERED_BY_CHECKS) <= covered
        assert (set(COVERED_BY_GPU_CHECKS) <= covered) == gpu_checks
        assert sum(map(len, runs.values())) == len(everything - covered), gpu_checks
        assert set().union(*runs.values()) == everything - covered, gpu_checks
        assert any(t.startswith("tests/gpu/") for t in runs["gpu"]) and not any(t.startswith("tests/gpu/") for t in runs["cpu"])
        assert any(t.startswith("tests/unit/") for t in runs["cpu"]) and all(t.startswith("tests/perf/") for t in runs["perf"])


def test_verdict_keeps_the_exit_code_meanings():
    assert verdict([0, 0], 0) == 0
    assert verdict([1, 0], 0) == verdict([0, 0], 1) == verdict([0, 5], 0) == 1
    assert verdict([0, 0], 2) == verdict([4, 0], 1) == 2


# --- time to verdict --------------------------------------------------------------------------------
def test_layer_of_a_test():
    assert gate_time.layer_of("tests/gpu/test_syncs_gpu.py::test_x[nt]") == "gpu"
    assert gate_time.layer_of("tests/unit/test_data.py::test_y") == "unit"
    assert gate_time.layer_of("tests/test_top.py::t") == "other"


@pytest.mark.parametrize("require_gpu", [True, False])
def test_check_step_hands_require_gpu_on_to_its_check(tmp_path, monkeypatch, require_gpu):
    """The gate runs each check step as `python -m parity.gate --_check-step ... [--require-gpu]`: a step that
    dropped --require-gpu (the gate's parser had taken it) let a switch that never ran pass the GPU gate."""
    import parity.cli
    from parity.gate import run

    seen = []
    monkeypatch.setattr(parity.cli, "main", lambda argv: seen.append(argv) or 1)
    check_args = ["--report-dir", str(tmp_path), "--model", "vit_tiny", *(["--require-gpu"] if require_gpu else [])]
    assert run.main([run.CHECK_STEP, str(tmp_path / "t.json"), *check_args]) == 1  # the check's verdict is the step's
    assert seen == [["check", *check_args]]
    assert json.loads((tmp_path / "t.json").read_text()).keys() == {"compile_seconds"}


def test_table_merges_workers_and_adds_the_check_step(tmp_path):
    worker0 = [gate_time.TestTime("tests/gpu/a.py::t", "gpu", 10.0, 8.0, "passed")]
    worker1 = [gate_time.TestTime("tests/gpu/b.py::t", "gpu", 5.0, 1.0, "failed"),
               gate_time.TestTime("tests/unit/c.py::t", "unit", 0.5, 0.0, "passed")]
    for i, part in enumerate((worker0, worker1)):
        gate_time.write_tests(tmp_path / f"w{i}.json", part)
    merged = gate_time.read_tests(tmp_path / "w0.json") + gate_time.read_tests(tmp_path / "w1.json")
    check = {"layer": "python -m parity check", "tests": 1, "failed": 0, "seconds": 30.0, "compile_seconds": 12.0}
    rows = gate_time.summarize(merged, [check])
    assert [r["layer"] for r in rows] == ["unit", "gpu", "python -m parity check"]
    assert rows[1] == {"layer": "gpu", "tests": 2, "failed": 1, "seconds": 15.0, "compile_seconds": 9.0, "cpu_seconds": 0.0}
    markdown = gate_time.write_table(tmp_path, rows, {"total": 45.5}, slowest_tests=gate_time.slowest(merged, n=2))
    assert "| gpu | 2 | 1 | 15.0 | 9.0 |" in markdown and "wall time, total: 45.5 s" in markdown
    # the slowest tests by name, slowest first, across workers: where a layer's wall time goes
    assert markdown.index("| `tests/gpu/a.py::t` | gpu | 10.0 | 8.0 |") < markdown.index("| `tests/gpu/b.py::t` | gpu | 5.0 | 1.0 |")
    assert "c.py" not in markdown
    table = json.loads((tmp_path / "gate-time.json").read_text())
    assert table["layers"] == rows and [t["test"] for t in table["slowest"]] == ["tests/gpu/a.py::t", "tests/gpu/b.py::t"]


def test_table_gives_cpu_seconds_and_why_a_test_is_slow(tmp_path):
    tests = [gate_time.TestTime("tests/system/a.py::t", "system", 90.0, 50.0, "passed", cpu_seconds=170.0,
                                slow_reason="compiles the whole encoder"),
             gate_time.TestTime("tests/unit/b.py::t", "unit", 61.0, 0.0, "passed", cpu_seconds=60.5),
             gate_time.TestTime("tests/unit/c.py::t", "unit", 59.0, 0.0, "passed", cpu_seconds=58.0)]
    rows = gate_time.summarize(tests)
    assert [(r["layer"], r["cpu_seconds"]) for r in rows] == [("unit", 118.5), ("system", 170.0)]
    markdown = gate_time.to_markdown(rows, {}, slowest_tests=gate_time.slowest(tests))
    assert "| system | 1 | 0 | 90.0 | 50.0 | 170.0 |" in markdown
    assert "| `tests/system/a.py::t` | system | 90.0 | 50.0 | 170.0 | compiles the whole encoder |" in markdown
    # only the test over the limit that gives no reason is a finding; one just under it is not
    (finding,) = gate_time.unexplained_slow(tests)
    assert finding.startswith("`tests/unit/b.py::t` took 61.0 s") and '@pytest.mark.slow(reason="...")' in finding
    assert gate_time.unexplained_slow(tests, limit=100.0) == []


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist"])
def test_pytest_writes_per_test_times_through_the_plugin(tmp_path, workers):
    """The conftest's hooks in a real pytest run: every test timed, with its layer, its compile
    seconds (which, under xdist, travel from the worker in the test's report), when it ran and where."""
    if workers:
        pytest.importorskip("xdist", reason="pytest-xdist is not installed")
    out = tmp_path / "times.json"
    env = child_env(SAMFAST_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(compile_cache.ENV_ACTIVE, None)
    here = "tests/unit/test_gate_plumbing.py::"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--gate-time", str(out),
           *(["-n", str(workers)] if workers else []),
           here + "test_layer_of_a_test", here + "test_compile_seconds_survive_a_dynamo_reset"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    times = {t.nodeid.removeprefix(here): t for t in gate_time.read_tests(out)}
    assert set(times) == {"test_layer_of_a_test", "test_compile_seconds_survive_a_dynamo_reset"}
    assert all(t.layer == "unit" and t.seconds >= 0 and t.outcome == "passed" for t in times.values())
    assert times["test_compile_seconds_survive_a_dynamo_reset"].compile_seconds > 0
    assert times["test_layer_of_a_test"].compile_seconds == 0
    # CPU seconds and the slow marker's reason travel from an xdist worker too
    assert times["test_compile_seconds_survive_a_dynamo_reset"].cpu_seconds > 0
    assert times["test_compile_seconds_survive_a_dynamo_reset"].slow_reason == COMPILES_TWICE
    assert times["test_layer_of_a_test"].slow_reason == ""
    ran_from = min(t.started for t in times.values())
    assert all(time.time() - 600 < ran_from <= t.started <= t.ended - t.seconds + 1e-3 for t in times.values())
    assert {t.worker for t in times.values()} <= ({"gw0", "gw1"} if workers else {""})
    (folder,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert compile_cache.why_untrusted(folder, json.loads((folder / "key.json").read_text())) is None  # sealed


# --- the model cache: built once, shared read-only --------------------------------------------------
@pytest.fixture(scope="module")
def counted():
    """A cache over vit_tiny on the CPU whose builds are counted."""
    import samfast

    calls = []

    def build(*args, **kwargs):
        calls.append((args, kwargs))
        return samfast.build_sam(*args, **kwargs)

    return ModelCache(build), calls


def test_a_stage_is_built_once_across_layers(counted):
    cache, calls = counted
    before = len(calls)
    stage_layer = cache.get("vit_tiny", "fp32", batch=2, compile_mode="default", device="cpu")
    sync_layer = cache.get("vit_tiny", "fp32", batch=2, compile_mode="max-autotune", device="cpu")  # eager: mode ignored
    assert sync_layer is stage_layer and len(calls) == before + 1
    assert not stage_layer.training and not any(p.requires_grad for p in stage_layer.parameters())


def test_keys_use_canonical_stage_names_and_mode_only_when_compiled():
    same = {make_key("vit_b", s, batch=2, compile_mode="default", device="cuda") for s in ("triton", "bf16+compile+sdpa+triton")}
    assert len(same) == 1
    assert make_key("vit_b", "nt", batch=2, compile_mode="default", device="cuda") != make_key(
        "vit_b", "nt", batch=2, compile_mode="max-autotune", device="cuda")
    assert make_key("vit_b", "nt", batch=2, compile_mode="default", device="cuda") != make_key(
        "vit_b", "nt", batch=32, compile_mode="default", device="cuda")


@pytest.mark.parametrize("mutation", ["switches", "weights_in_place", "weights_replaced", "patched_forward", "train_mode"])
def test_a_test_that_changes_a_shared_model_fails(counted, mutation):
    cache, _ = counted
    model = cache.get("vit_tiny", "fp32+sdpa", batch=1, device="cpu")
    if mutation == "switches":
        model.switches = model.switches - {"sdpa"}
    elif mutation == "weights_in_place":
        model.mask_decoder.iou_token.weight.add_(1.0)
    elif mutation == "weights_replaced":
        model.mask_decoder.iou_token.weight.data = model.mask_decoder.iou_token.weight.data.clone()
    elif mutation == "patched_forward":
        model.mask_decoder.forward = lambda *a, **k: None
    elif mutation == "train_mode":
        model.train()
    with pytest.raises(SharedModelMutated, match="fp32\\+sdpa"):
        cache.get("vit_tiny", "fp32+sdpa", batch=1, device="cpu")
    cache._entries.clear()  # the next parametrization starts from a fresh build


def test_a_shallow_copy_may_change_its_own_switches(counted):
    cache, _ = counted
    model = cache.get("vit_tiny", "fp32+sdpa", batch=1, device="cpu")
    view = copy.copy(model)
    view.switches = model.switches - {"sdpa"}
    cache.check_untouched()
    assert model.switches == {"sdpa"}


COMPILES_TWICE = "compiles one function twice, around a dynamo reset"


@pytest.mark.slow(reason=COMPILES_TWICE)
def test_compile_seconds_survive_a_dynamo_reset():
    """torch._dynamo.reset() clears dynamo's tally; the gate's count keeps what was compiled before it."""
    import torch

    def compile_once():
        torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))

    start = gate_time.compile_seconds_so_far()
    compile_once()
    after_first = gate_time.compile_seconds_so_far()
    torch._dynamo.reset()
    compile_once()
    after_second = gate_time.compile_seconds_so_far()
    assert start < after_first < after_second


# --- run order: the previous run's slowest tests first ------------------------------------------------
def test_longest_first_keeps_groups_together_and_puts_untimed_tests_first():
    items = ["a", "b1", "c", "b2", "new", "d"]
    group = {"b1": "b", "b2": "b"}.get
    seconds = {"a": 5.0, "b1": 20.0, "b2": 30.0, "c": 90.0, "d": 5.0}
    ordered = run_order.longest_first(items, seconds, nodeid=str, group_of=lambda i: group(i, i))
    # never timed (may be slow), then c 90 s, then group b (50 s, its two tests together in their order), then a and d tied
    assert ordered == ["new", "c", "b1", "b2", "a", "d"]
    assert run_order.longest_first(items, {}, nodeid=str, group_of=str) == items  # no history: collection order


def test_a_cold_run_orders_by_the_committed_cold_times(tmp_path):
    """Without a previous run's times the gate names COLD_ORDER: its tests by their seconds, any test
    it does not list as quick (not as never timed, which would put it first)."""
    rows = [gate_time.TestTime("tests/gpu/v.py::t", "gpu", 80.0, 40.0, "passed"),
            gate_time.TestTime("tests/unit/q.py::t", "unit", 0.2, 0.0, "passed"),
            gate_time.TestTime("tests/unit/s.py::t", "unit", 3.0, 0.0, "passed")]
    assert run_order.write_cold_order(rows, tmp_path / "cold.json") == 2  # the quick one is left out
    seconds, untimed = run_order.read_order(tmp_path / "cold.json")
    assert seconds == {"tests/gpu/v.py::t": 80.0, "tests/unit/s.py::t": 3.0} and untimed < run_order.COLD_ORDER_MIN_SECONDS
    items = ["tests/unit/q.py::t", "tests/unit/new.py::t", "tests/unit/s.py::t", "tests/gpu/v.py::t"]
    assert run_order.longest_first(items, seconds, nodeid=str, group_of=str, untimed=untimed) == \
        ["tests/gpu/v.py::t", "tests/unit/s.py::t", "tests/unit/q.py::t", "tests/unit/new.py::t"]
    gate_time.write_tests(tmp_path / "previous.json", rows)  # a previous run's file: a missing test was never timed
    assert run_order.read_order(tmp_path / "previous.json")[1] == float("inf")
    committed, _ = run_order.read_order(run_order.COLD_ORDER)
    assert len(committed) > 100 and all(s >= run_order.COLD_ORDER_MIN_SECONDS for s in committed.values())


def test_the_cold_order_is_rewritten_from_a_gate_runs_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_order, "COLD_ORDER", tmp_path / "cold-order.json")
    with pytest.raises(SystemExit) as refused:
        run_order.main([str(tmp_path)])
    assert refused.value.code == 2 and "run `python -m parity.gate` there first" in capsys.readouterr().err
    gate_time.write_tests(tmp_path / "gate-time-gpu.json", [gate_time.TestTime("tests/gpu/a.py::t", "gpu", 9.0, 5.0, "passed")])
    gate_time.write_tests(tmp_path / "gate-time-cpu.json", [gate_time.TestTime("tests/unit/b.py::t", "unit", 0.1, 0.0, "passed")])
    assert run_order.main([str(tmp_path)]) == 0
    assert run_order.read_order(tmp_path / "cold-order.json")[0] == {"tests/gpu/a.py::t": 9.0}


def test_unreadable_times_only_lose_the_order(tmp_path, capsys):
    assert run_order.read_seconds(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text('{"tests": [{"nodeid": "x"}]}')  # a field missing
    assert run_order.read_seconds(tmp_path / "bad.json") == {}
    assert "unreadable" in capsys.readouterr().err
    gate_time.write_tests(tmp_path / "good.json", [gate_time.TestTime("t::a", "unit", 2.5, 0.0, "passed")])
    assert run_order.read_seconds(tmp_path / "good.json") == {"t::a": 2.5}


def test_pytest_under_the_gate_collects_the_slowest_first_and_xdist_workers_agree(tmp_path):
    here = "tests/unit/test_gate_plumbing.py::"
    names = ["test_layer_of_a_test", "test_verdict_keeps_the_exit_code_meanings", "test_checks_compile_in_mode_default_unless_told_otherwise"]
    times = tmp_path / "times.json"  # last run: the last one collected was the slowest
    gate_time.write_tests(times, [gate_time.TestTime(here + n, "unit", s, 0.0, "passed") for n, s in zip(names, (1.0, 2.0, 3.0))])
    env = child_env(**{run_order.TIMES_ENV: str(times), "SAMFAST_CACHE_DIR": str(tmp_path / "cache")})
    env.pop(compile_cache.ENV_ACTIVE, None)
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *(here + n for n in names)]
    collected = subprocess.run([*base, "--collect-only", "-q"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert [line.removeprefix(here) for line in collected.stdout.splitlines() if "::" in line] == names[::-1]
    if importlib.util.find_spec("xdist"):  # workers collect on their own: a different order would stop the run
        done = subprocess.run([*base, "-q", "-n", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout + done.stderr


def test_the_gate_keeps_this_runs_times_for_the_next_and_names_them_to_its_steps(tmp_path, monkeypatch):
    import parity.gate.run as gate

    saw = tmp_path / "saw"
    step = ("import os, sys; from parity.gate import timing as gate_time; open(sys.argv[1], 'w').write(os.environ['SAMFAST_TEST_TIMES']);"
            "gate_time.write_tests(sys.argv[2], [gate_time.TestTime('tests/unit/x.py::t', 'unit', 7.5, 0.0, 'passed')])")
    reports = tmp_path / "reports"
    stand_in_steps(monkeypatch, tmp_path, cpu=[sys.executable, "-c", step, str(saw), str(reports / "gate-time-cpu.json")])
    assert gate.main(["--report-dir", str(reports)]) == 0
    assert saw.read_text() == str(run_order.COLD_ORDER)  # a cold cache: the committed cold order
    (cache,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert run_order.read_seconds(cache / run_order.TIMES_FILE) == {"tests/unit/x.py::t": 7.5}
    assert compile_cache.why_untrusted(cache, json.loads((cache / "key.json").read_text())) is None  # written before the seal
    assert gate.main(["--report-dir", str(reports)]) == 0
    assert saw.read_text() == str(cache / run_order.TIMES_FILE)  # the next run: the last run's times


def test_xdist_groups_run_on_one_worker_with_the_installed_pytest(tmp_path):
    """The gate shares a built model between the tests of one xdist group (`--dist loadgroup`). pytest
    9.2's structured node ids silently broke pytest-xdist 3.8's grouping (pytest-dev/pytest-xdist#1386:
    it appends the group to `item._nodeid`, which 9.2 no longer reads), so every test of a group could
    land on another worker and build the model again. This fails if the installed pair does that."""
    pytest.importorskip("xdist", reason="without pytest-xdist the gate runs one process: nothing to group")
    suite = ("import os, pytest\n"
             "@pytest.mark.xdist_group('{g}')\n"
             "@pytest.mark.parametrize('i', range(6))\n"
             "def test_{g}(i):\n"
             "    open(os.environ['SEEN'] + f'/{g}-{{i}}', 'w').write(os.environ['PYTEST_XDIST_WORKER'])\n")
    for group in ("a", "b"):
        (tmp_path / f"test_{group}.py").write_text(suite.format(g=group))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this project's settings or conftest
    seen = tmp_path / "seen"
    seen.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "test_a.py", "test_b.py"], cwd=tmp_path, env=child_env(SEEN=str(seen)),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "12 passed" in done.stdout, done.stdout + done.stderr
    for group in ("a", "b"):
        workers = {(seen / f"{group}-{i}").read_text() for i in range(6)}
        assert len(workers) == 1, (f"xdist group {group!r} ran on workers {sorted(workers)}: --dist loadgroup does "
                                   f"not group with pytest {pytest.__version__}; install pytest<9.2 (pyproject.toml pins it)")
