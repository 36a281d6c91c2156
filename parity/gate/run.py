"""The whole gate in one command, timed: `nox -s parity` runs this (python -m parity.gate).

    python -m parity.gate [--require-gpu] [--perf-matrix] [--workers-per-gpu N] [--workers N] [--cpu-workers N] [CHECK ARGS ...]

1. the persistent compile cache is validated and switched on (parity.gate.compile_cache) before any
   child process starts, so pytest and the check both read and fill it; where the install has no
   bytecode, the children's is compiled into it once first (parity.gate.bytecode);
2. at the same time, each in its own process (compiling is CPU work, and the GPU has room for all):
   - the tests marked gpu (`pytest -m gpu`, perf aside): with pytest-xdist installed, 4 workers per
     GPU (--workers-per-gpu; tests/conftest.py assigns the GPUs); the tests that share a built model
     on one worker (--dist loadgroup), different models on different workers;
   - every other test (`pytest -m "not gpu"`: unit, parity on vit_tiny, the CPU compile checks) with
     CUDA hidden, over one xdist worker per core but one (niced), exactly as the CPU job runs them
     (tests that share a module fixture on one worker: parity.gate.worker_groups);
   - `python -m parity check` on every task's embedded defaults (parity.tasks.registry: point prompts,
     segment everything, video; CHECK ARGS override, e.g. --stages fp32 bf16), every default GPU stage
     when there is a GPU (the pytest test that runs the same is then left to this step). Not inside
     pytest: their models (the trained vit_tiny and sam2.1_hiera_nano) are not the GPU layers' (the
     two-block vit_b_2block and, in perf, vit_b and vit_h, seeded), so they would share no build, and
     their exit codes keep their meaning (2 = bad input);
   - with a GPU, perf's rows built and compiled, not timed (`pytest tests/perf --perf-warm-up`), so
     that perf loads its graphs from the cache instead of compiling them on its two cores;
   the CPU layers run at CPU_LAYERS_NICENESS (perf waits for the GPU steps, not for them); the
   background steps' output goes to reports/<step>.log, its tail printed when the step fails;
3. `pytest tests/perf` alone on one GPU and an otherwise idle machine (pytest-benchmark times
   nothing under xdist, and a timed row shares nothing); with --perf-early (the default with a GPU
   and 8+ cores) as soon as the GPU steps are done, on PERF_CORES cores of its own, while the CPU
   layers finish on the others;
4. reports/gate-time.md and .json: per layer the tests, their seconds and their compile seconds, and
   the wall time of each step; the cache is sealed when every step ran to a verdict (pytest exit
   0, 1 or 5, the checks 0 or 1), not after a crash or a refused input.

Exit code: 2 when the check refused its input or pytest its arguments, else 1 when anything failed, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from parity.checks.budgets import BudgetError
from parity.gate import bytecode, compile_cache, cpu_use, run_order, threads, time_budget, vec_isa
from parity.gate import timing as gate_time
from parity.gate import verdict as final_verdict
from parity.gate.allocator import heap_env
from parity.gate.devices import WORKERS_PER_GPU_ENV, cpu_model, gpu_names, visible_gpus
from parity.report.verdicts import REPORT_FILES
from parity.tasks.registry import TASKS

# The gate's three pytest runs, in the order their layers appear in the table.
PYTEST_RUNS = ("gpu", "cpu", "perf")


@dataclass(frozen=True)
class CheckStep:
    """One `python -m parity check` the gate runs beside the pytest layers, in its own process."""

    layer: str  # its row in the time table and its line in the verdict
    args: tuple[str, ...]
    report_dir: str = ""  # below the gate's --report-dir: two checks of one task must not share a folder
    task_dir: str = ""  # the folder its task writes into below that (Task.report_folder: the AMG task's amg/)

    def report(self, root: Path) -> Path:
        """Where its report.json lands under the gate's report folder root."""
        return root / self.report_dir / self.task_dir / "report.json"


def check_steps(gpu: bool) -> dict[str, CheckStep]:
    """Every task's embedded checks (parity.tasks.registry), by step name: point prompts, segment everything
    and video, for SAM 1 and SAM 2 as each task lists them (on a CPU a few stages of segment everything
    and video, with a GPU every default GPU stage: the tasks' embedded.py)."""
    return {check.step: CheckStep(check.layer, check.check_args(gpu), check.report_dir, task.report_folder)
            for task in TASKS.values() for check in task.embedded}


# The checks step 2 runs, each in its own process.
EMBEDDED_CHECKS = check_steps(gpu=False)
GPU_CHECKS = check_steps(gpu=True)
# Everything a gate run leaves in its report folder (the workflow uploads these).
OUTPUTS = (*REPORT_FILES, *(f"junit-{run}.xml" for run in PYTEST_RUNS), "pytest-cpu.log",
           *(f"{step}.log" for step in EMBEDDED_CHECKS), "perf-warm-up.log", "gate-time.md", "gate-time.json")
CACHE_STATES = {"cold": "empty: cold", "warm": "sealed: warm", "resumed": "a killed run's entries: resumed"}
# Tests that run what a check step runs: the gate leaves them to the step. CI's `nox -s tests` runs them.
# With or without a GPU: fp32 gives the committed check-sam2-amg golden again, exactly (a CPU test). The
# step reads the same golden (a stale or missing one fails it with exit 2), and on a CPU its fp32 stage
# runs this very comparison. It was the long pole of the GPU runners' CPU layers (114 s warm) and the
# 2-core gate's costliest test (75 of its 1,612 CPU seconds at 555708b).
COVERED_BY_CHECKS = ["tests/parity/test_sam2_gate.py::test_the_gate_steps_committed_golden_is_reproduced_in_fp32"]
# With a GPU only: the steps run every GPU stage against the goldens.
COVERED_BY_GPU_CHECKS = ["tests/parity/test_amg_gate.py::test_embedded_amg_golden_passes_every_stage_on_the_gpu",
                         # the lossless stages' masks near fp32's: the AMG step gates them tighter (matched IoU 0.99, not 0.95)
                         "tests/gpu/test_amg_gpu.py::test_lossless_stages_keep_fp32_masks",
                         "tests/parity/test_sam2_gate.py::test_embedded_sam2_amg_golden_passes_every_stage_on_the_gpu",
                         "tests/parity/test_concept_gate.py::test_embedded_concept_golden_passes_every_stage_on_the_gpu"]


def left_to_checks(gpu_checks: bool) -> list[str]:
    """The tests the gate's pytest runs leave to its check steps (GPU_CHECKS with `gpu_checks`)."""
    return [*COVERED_BY_CHECKS, *(COVERED_BY_GPU_CHECKS if gpu_checks else [])]


def pytest_commands(args, report_dir: Path, workers: int, cpu_workers: int, gpu_checks: bool) -> dict[str, list[str]]:
    """The three pytest runs: the gpu-marked tests (over `workers` GPUs), the others (over `cpu_workers`), perf.

    The tests the check steps cover are left out (left_to_checks; more with `gpu_checks`, when they run GPU_CHECKS).

    perf is a run of its own because pytest-benchmark switches itself off under xdist, and so that
    no other test shares the GPU (or the CPU that feeds it) while a row is timed.
    """
    common = [sys.executable, "-m", "pytest", *(["--require-gpu"] if args.require_gpu else [])]

    def run(name: str, selection: list[str], n: int, extra: list[str] = ()) -> list[str]:
        return [*common, *selection, "--gate-time", str(report_dir / f"gate-time-{name}.json"),
                "--junitxml", str(report_dir / f"junit-{name}.xml"), *extra,
                *(["-n", str(n), "--dist", "loadgroup", "--no-loadscope-reorder"] if n > 1 else [])]

    others = ["tests", "--ignore=tests/perf", "-m"]
    rows = ["--perf-matrix"] if args.perf_matrix else []  # perf's rows, and so its warm-up's
    covered = [f"--deselect={test}" for test in left_to_checks(gpu_checks)]
    return {"gpu": run("gpu", [*others, "gpu", *covered], workers),
            "cpu": run("cpu", [*others, "not gpu", *covered], cpu_workers),
            "perf": run("perf", ["tests/perf"], 1, [*rows, *shlex.split(args.perf_args)]),
            # perf's rows compiled beside the GPU layers (every core), so that perf (on PERF_CORES, after
            # them) loads its graphs instead of compiling them: on a cold H100 gate perf's compiles were
            # 52 of its 115 s
            "perf warm-up": [*common, "tests/perf", "-k", "test_stage_within_budget", "--perf-warm-up", "-q", *rows]}


class GateUsageError(Exception):
    """Options that cannot work together or on this machine: the gate exits 2 (bad input) naming them."""


def spare_cores(cores: int) -> int:
    """The cores left to the CPU layers: all but one (the gate and inductor's compile helpers), every one
    on a machine of two or fewer. They run niced (CPU_LAYERS_NICENESS), so while the GPU-layer workers and
    the checks compile they take only what those leave, and once those are done they have every core:
    xdist's worker count is fixed at the start (H100 at 47577b7, warm: with cores - GPU workers - 1 = 10
    workers, 4 of 14 cores idled for the last ~100 s of the CPU layers' 244 s). On two cores one held back
    idled half the machine once the checks were done (their first ~3 minutes): the cold CPU gate took
    1756 s with one worker (58d69dc), 1359 s with two (docs/measurements/gate/gate-time-cpu-cold-two-workers-2026-11-28-3cd037d.md)."""
    return cores if cores <= 2 else cores - 1


def cpu_layers_env(cpu_workers: int, spare: int, environ=os.environ) -> dict[str, str]:
    """The CPU layers' environment: no GPU (they run as the CPU job runs them), their spare cores split evenly
    as threads, big tensors from the heap (parity.gate.allocator)."""
    return {**heap_env(environ), "CUDA_VISIBLE_DEVICES": "", threads.ENV: str(threads.per_process(spare, cpu_workers))}


def check_env(environ=os.environ) -> dict[str, str]:
    """The check steps compile in mode `default` (unless SAMFAST_COMPILE_MODE says otherwise): they gate
    correctness, and max-autotune's kernel search cost minutes per stage on a cold cache (H100: the
    embedded check's `sdpa` stage 106 s for 16 images) for kernels the thresholds do not depend on. Their
    big tensors come from the heap (parity.gate.allocator)."""
    return {"SAMFAST_COMPILE_MODE": "default", **heap_env(environ)}


def untimed_gpu_env(environ=os.environ) -> dict[str, str]:
    """The GPU layers' and the checks' environment: OpenMP's idle threads sleep (unless OMP_WAIT_POLICY
    is set). Each of these processes has an OpenMP thread per core, and after every parallel CPU op
    (preprocessing, postprocessing, a reference computed on the CPU) those threads spin, burning cores
    the other steps need: on a warm 16-core H100 gate the 4 GPU-layer workers used 1887 core-seconds,
    1418 of them in their idle OpenMP threads (docs/gpu-gate.md). PASSIVE keeps the parallel work and
    drops the spinning. perf is timed as users run it and keeps OpenMP's default."""
    return {"OMP_WAIT_POLICY": "PASSIVE", **environ}


# The CPU layers run at this niceness. perf starts when the GPU layers and the checks are done, so
# those set the cold gate's wall (H100 at a833d93: GPU layers 438 s while compiling beside 7 CPU
# workers and 3 checks, perf after them); the CPU layers, which perf does not wait for, still get
# every cycle the others leave.
CPU_LAYERS_NICENESS = 10
# With --perf-early, the cores perf keeps to itself while the CPU layers finish on the others.
PERF_CORES = 2
# --perf-early is the default with a GPU and at least this many cores (6 left to the other steps).
PERF_EARLY_MIN_CORES = 8
# Beyond this, more workers cost more in start-up (each imports torch) than they save on ~570 tests.
MAX_CPU_WORKERS = 16


def choose_cpu_workers(requested: int | None, spare: int, have_xdist: bool) -> int:
    """xdist workers for the CPU layers: one per spare core (at most MAX_CPU_WORKERS), 1 without xdist.

    They set the warm gate's time: on an H100 runner with 16 cores (3 GPU workers and 2 checks
    beside them, so 10 spare cores), 4 workers took 351 s and 10 took 249 s (docs/gpu-gate.md).
    """
    if requested is not None:
        if requested > 1 and not have_xdist:
            raise GateUsageError("--cpu-workers > 1 needs pytest-xdist (pip install pytest-xdist)")
        return requested
    return max(1, min(MAX_CPU_WORKERS, spare)) if have_xdist else 1


def choose_workers(requested: int | None, gpus: list[str], have_xdist: bool, per_gpu: int = 1) -> tuple[int, str]:
    """(workers, why) for the gpu tests: `per_gpu` per GPU when xdist is there, never more than that."""
    if requested is not None:
        if gpus and requested > len(gpus) * per_gpu:
            raise GateUsageError(f"--workers {requested} but {len(gpus)} GPU(s) and --workers-per-gpu {per_gpu}: "
                             f"at most {len(gpus) * per_gpu}")
        if requested > 1 and not have_xdist:
            raise GateUsageError("--workers > 1 needs pytest-xdist (pip install pytest-xdist)")
        return requested, "asked for"
    if not gpus or (len(gpus) * per_gpu == 1):
        return 1, f"{len(gpus)} GPU(s): one process"
    if not have_xdist:
        return 1, f"{len(gpus)} GPU(s) but pytest-xdist is not installed: one process"
    return len(gpus) * per_gpu, f"{per_gpu} per GPU, {len(gpus)} GPU(s)"


# `python -m parity.gate --_check-step OUT_JSON CHECK ARGS...`: how the gate runs a check step in a process of
# its own. The gate's parser never reads a step's arguments: options the two share (--report-dir,
# --require-gpu) reach the check as given.
CHECK_STEP = "--_check-step"


def run_check_step(check_args: list[str], out_json: Path) -> int:
    """`python -m parity check` in this process, then its compile seconds to out_json (the driver's child)."""
    from parity.cli import main

    try:
        code = main(["check", *check_args])
    except SystemExit as exit_:  # argparse: bad arguments
        code = exit_.code if isinstance(exit_.code, int) else 2
    out_json.write_text(json.dumps({"compile_seconds": round(gate_time.compile_seconds_so_far(), 3)}))
    return code


def choose_perf_early(requested: bool | None, gpus: list[str], cores: int) -> bool:
    """Perf early unless told otherwise, where it can be: with a GPU (without one nothing is timed)
    and PERF_EARLY_MIN_CORES. On the H100 runner its rows equalled a quiet run's within 1%
    (docs/gpu-gate.md) and it took perf's ~80 s off the warm gate's wall."""
    if requested is not None:
        return requested
    return bool(gpus) and cores >= PERF_EARLY_MIN_CORES


def split_cores(available: set[int], perf_early: bool) -> tuple[set[int] | None, set[int] | None]:
    """(perf's cores, every other step's cores): with perf_early, perf keeps PERF_CORES of its own
    (it is timed while the CPU layers finish on the rest); otherwise nobody is pinned (None, None)."""
    if not perf_early:
        return None, None
    if len(available) <= PERF_CORES:
        raise GateUsageError(f"--perf-early keeps {PERF_CORES} cores for perf and needs more than that "
                         f"(this process may use {len(available)})")
    ordered = sorted(available)
    return set(ordered[-PERF_CORES:]), set(ordered[:-PERF_CORES])


def _start_in(cores: set[int] | None, niceness: int = 0):
    """A preexec_fn that keeps a child (and everything it starts) on `cores` (None: no pinning) at
    `niceness` above the gate's; None when there is nothing to set."""
    if cores is None and not niceness:
        return None

    def start() -> None:
        if cores is not None:
            os.sched_setaffinity(0, cores)
        if niceness:
            os.nice(niceness)

    return start


def _timed(cmd: list[str], env: dict[str, str] | None = None, cores: set[int] | None = None,
           cpu: cpu_use.StepCpu | None = None, step: str = "") -> tuple[int, float]:
    print("+ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    process = subprocess.Popen(cmd, env=env, preexec_fn=_start_in(cores))
    if cpu is not None:
        cpu.watch(step, process.pid)
    return process.wait(), time.perf_counter() - start


class Background:
    """A command running beside the gate's other steps (`niceness` above the gate's), its output in a
    log file; wait() gives (code, seconds)."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, cores: set[int] | None = None,
                 niceness: int = 0):
        print(f"+ (in the background, output in {log}) " + " ".join(cmd), flush=True)
        self.log, self.start = log, time.perf_counter()
        with open(log, "wb") as out:
            self.process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            preexec_fn=_start_in(cores, niceness))
        # The steps are waited for one after another; a step that ended while the gate waited for
        # another must report when it ended, not when the gate got round to it.
        self.ended = threading.Thread(target=self._stamp_end, daemon=True)
        self.ended.start()

    def _stamp_end(self) -> None:
        self.process.wait()
        self.seconds = time.perf_counter() - self.start

    def wait(self, tail_lines: int = 60) -> tuple[int, float]:
        code = self.process.wait()
        self.ended.join()
        seconds = self.seconds
        lines = self.log.read_text(errors="replace").splitlines()
        shown = lines[-tail_lines:] if code not in (0, 5) else lines[-1:]
        print(f"--- {self.log} (exit {code}, {seconds:.0f} s){', last lines' if len(shown) > 1 else ''}:",
              *shown, sep="\n", flush=True)
        return code, seconds


def verdict(pytest_codes: list[int], check_code: int) -> int:
    """2: the check refused its input or pytest its arguments (usage error); 1: anything else failed."""
    if check_code == 2 or 4 in pytest_codes:
        return 2
    return 0 if check_code == 0 and not any(pytest_codes) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHECK_STEP]:  # a check step the gate started: the rest is its check's command line, untouched
        return run_check_step(argv[2:], Path(argv[1]))
    parser = argparse.ArgumentParser(prog="python -m parity.gate", description=__doc__.split("\n")[0])
    parser.add_argument("--require-gpu", action="store_true", help="GPU tests fail instead of skipping without CUDA, "
                        "and so does a check stage whose switch did not run")
    parser.add_argument("--perf-matrix", action="store_true", help="time every budgets.toml row, not only the gating ones")
    parser.add_argument("--workers", type=int, help="pytest-xdist workers for the gpu tests (default: --workers-per-gpu per GPU)")
    parser.add_argument("--workers-per-gpu", type=int, default=4, help="xdist workers per GPU for the untimed GPU "
                        "layers (default 4: their time is mostly compiling, CPU work; perf runs alone afterwards)")
    parser.add_argument("--cpu-workers", type=int, help="pytest-xdist workers for the tests not marked gpu "
                        "(default: one per core but one, at most 16; they run niced beside the GPU layers)")
    parser.add_argument("--report-dir", type=Path, default=Path("reports"))
    parser.add_argument("--perf-args", default="", help="more pytest options for the perf run, e.g. "
                        "'--benchmark-compare=0001 --benchmark-compare-fail=mean:15%%'")
    parser.add_argument("--perf-early", action=argparse.BooleanOptionalAction, help=f"time perf as soon as the GPU "
                        f"steps are done, on {PERF_CORES} cores of its own, while the CPU-only layers (which never "
                        f"touch the GPU) finish on the others (default: on with a GPU and {PERF_EARLY_MIN_CORES}+ cores); "
                        "--no-perf-early times it alone after everything else")
    parser.add_argument("--strict-time", action="store_true", help="a step over 1.5x its time budget (budgets.toml "
                        "[gate_time.<runner>.<cold|warm>]) fails the gate; over 1x it is a finding in the report "
                        "either way (healthy runners of one GPU kind differ by up to ~1.4x)")
    args, check_args = parser.parse_known_args(argv)

    # Every option is checked before anything is touched: a refused command line leaves the
    # reports and the compile cache (which a run unseals while it uses it) as they were.
    started = time.perf_counter()
    if args.workers_per_gpu < 1:
        parser.error(f"--workers-per-gpu must be at least 1 (got {args.workers_per_gpu})")
    gpus = visible_gpus()
    have_xdist = importlib.util.find_spec("xdist") is not None
    checks = GPU_CHECKS if gpus else EMBEDDED_CHECKS
    try:
        workers, why = choose_workers(args.workers, gpus, have_xdist, args.workers_per_gpu)
        # The cores this process may use (a container's CPU limit shows here, not in os.cpu_count()).
        available = os.sched_getaffinity(0)
        args.perf_early = choose_perf_early(args.perf_early, gpus, len(available))
        perf_cores, other_cores = split_cores(available, args.perf_early)
        cores = len(other_cores or available)
        spare = spare_cores(cores)
        cpu_workers = choose_cpu_workers(args.cpu_workers, spare, have_xdist)
        gpu_models = gpu_names() if gpus else []  # visible_gpus gives indices
        runner = time_budget.runner_class(gpu_models)
        if args.strict_time and time_budget.load(runner, "cold") is None:
            raise GateUsageError("--strict-time: " + time_budget.missing_row(runner, "cold"))
    except (GateUsageError, BudgetError) as error:
        parser.error(str(error))  # exit 2, bad input

    args.report_dir.mkdir(parents=True, exist_ok=True)
    for stale in (*(f"gate-time-{run}.json" for run in PYTEST_RUNS), *(f"gate-time-{k}.json" for k in EMBEDDED_CHECKS)):
        (args.report_dir / stale).unlink(missing_ok=True)  # a step that dies must not report an older run
    cache = compile_cache.activate()
    isa_note = vec_isa.settle(cache.path, may_write=cache.owned)  # before any step starts: they inherit it
    bytecode_note = bytecode.fill(os.environ)  # once, before the steps would each compile it
    times = cache.path / run_order.TIMES_FILE  # the previous run's, kept with the compile cache
    # every pytest run below starts its slowest tests first: by the previous run's times, or a cold run's
    os.environ[run_order.TIMES_ENV] = str(times if times.exists() else run_order.COLD_ORDER)
    state = "cold" if cache.started_empty else "resumed" if cache.resumed else "warm"  # which time budget applies
    print(f"compile cache: {cache.path} ({CACHE_STATES[state]} run); "
          f"pytest workers: {workers} for the gpu tests ({why}), {cpu_workers} for the others", flush=True)

    commands = pytest_commands(args, args.report_dir, workers, cpu_workers, gpu_checks=bool(gpus))
    # Everything untimed at once: CPU layers, GPU layers and the two checks (compiling is CPU work, and
    # the GPU has room for all); perf after, alone (or, --perf-early, once the GPU is free).
    cpu = cpu_use.StepCpu().start()  # which step uses the cores: printed under the time table
    # Every core for every step until perf starts: perf's cores would idle until then (2 of the H100
    # runner's 16 for the GPU layer's ~160 s); the CPU layers are moved off them when it does.
    background = {"pytest cpu": Background(commands["cpu"], cpu_layers_env(cpu_workers, spare),
                                           args.report_dir / "pytest-cpu.log", niceness=CPU_LAYERS_NICENESS)}
    # without a GPU perf times nothing; on a warm cache perf only loads its graphs, as a warm-up would
    if gpus and state != "warm":
        background["perf warm-up"] = Background(commands["perf warm-up"], untimed_gpu_env(),
                                                args.report_dir / "perf-warm-up.log")
    for key, step in checks.items():
        background[step.layer] = Background([sys.executable, "-m", "parity.gate", CHECK_STEP,
                                             str(args.report_dir / f"gate-time-{key}.json"), "--report-dir",
                                             str(args.report_dir / step.report_dir), *step.args, *check_args,
                                             *(["--require-gpu"] if args.require_gpu and (gpus or key == "check") else [])],
                                            untimed_gpu_env(check_env()), args.report_dir / f"{key}.log")
    for name, step_process in background.items():
        cpu.watch(name, step_process.process.pid)
    codes, wall = {}, {}
    gpu_env = untimed_gpu_env({**os.environ, WORKERS_PER_GPU_ENV: str(args.workers_per_gpu)})
    codes["gpu"], wall["pytest gpu"] = _timed(commands["gpu"], gpu_env, cpu=cpu, step="pytest gpu")
    cpu_layers = background.pop("pytest cpu")
    if not args.perf_early:
        codes["cpu"], wall["pytest cpu"] = cpu_layers.wait()
    check_codes, check_rows = {}, []
    for key, step in checks.items():
        layer = step.layer
        check_codes[layer], wall[layer] = background[layer].wait()
        check_json = args.report_dir / f"gate-time-{key}.json"
        check_compile = json.loads(check_json.read_text())["compile_seconds"] if check_json.exists() else 0.0
        check_rows.append({"layer": layer, "tests": 1, "failed": int(check_codes[layer] != 0),
                           "seconds": round(wall[layer], 1), "compile_seconds": round(check_compile, 1)})
    warm_up = background.pop("perf warm-up", None)
    if warm_up is not None:  # its exit code gates nothing: a failing row fails in perf itself
        warm_up_code, wall["perf warm-up"] = warm_up.wait()
    if perf_cores:
        cpu_use.move_to(cpu_layers.process.pid, other_cores)
    codes["perf"], wall["pytest perf"] = _timed(commands["perf"], cores=perf_cores, cpu=cpu, step="pytest perf")
    if args.perf_early:
        codes["cpu"], wall["pytest cpu"] = cpu_layers.wait()
    # one code for both checks: 2 (a refused input) outranks any other failure (1, or a signal's negative code)
    check_code = 2 if 2 in check_codes.values() else int(any(check_codes.values()))
    wall["total"] = time.perf_counter() - started
    core_seconds = cpu.stop()

    tests = [t for run in PYTEST_RUNS if (args.report_dir / f"gate-time-{run}.json").exists()
             for t in gate_time.read_tests(args.report_dir / f"gate-time-{run}.json")]
    rows = gate_time.summarize(tests, check_rows)
    notes = [f"compile cache {CACHE_STATES[state]}: {cache.path}",
             "CPU core-seconds by step (at least: /proc read every second): " + ", ".join(
                 f"{step} {used:.0f} ({used / wall[step]:.1f} cores over its {wall[step]:.0f} s)"
                 for step, used in core_seconds.items() if wall.get(step)),
             f"runner: {', '.join(gpu_models) or 'no GPU'}; {cpu_model()}, {len(available)} cores",
             f"pytest workers: {workers} for the gpu tests ({why}); {cpu_workers} for the others, with CUDA hidden "
             f"({cores} CPU cores); these and the checks at the same time (the CPU layers at "
             f"niceness {CPU_LAYERS_NICENESS}), then perf "
             + (f"on cores {sorted(perf_cores)} of its own while the CPU layers finished (on every core until perf "
                f"started, then moved off perf's)" if perf_cores else "alone")
             + " (wall times overlap)",
             f"checks compiled in mode {check_env()['SAMFAST_COMPILE_MODE']} (SAMFAST_COMPILE_MODE)",
             (f"perf's rows compiled beside the GPU layers first (pytest tests/perf --perf-warm-up: "
              f"{wall['perf warm-up']:.0f} s, exit {warm_up_code}, log perf-warm-up.log)" if warm_up is not None
              else f"perf's rows not warmed up beside the GPU layers ({'warm cache' if gpus else 'no GPU'})"),
             f"OpenMP's idle threads in the GPU layers and the checks: OMP_WAIT_POLICY="
             f"{untimed_gpu_env()['OMP_WAIT_POLICY']}; perf: {os.environ.get('OMP_WAIT_POLICY', 'OpenMP default')}",
             isa_note,
             bytecode_note,
             "exit codes: " + ", ".join(f"pytest {step} {code}" for step, code in codes.items())
             + ", " + ", ".join(f"{step} {code}" for step, code in check_codes.items())]
    wall = {step: round(seconds, 1) for step, seconds in wall.items()}
    step_of = {"pytest gpu": "gpu", "pytest cpu": "cpu", "pytest perf": "perf", "total": "whole",
               **{step.layer: key for key, step in checks.items()}}
    budget = time_budget.load(runner, state)
    allowed = {name: budget[step] for name, step in step_of.items() if budget and step in budget}
    step_walls = {step_of[name]: seconds for name, seconds in wall.items() if name in step_of}
    findings = time_budget.over_budget(step_walls, budget) if budget else [time_budget.missing_row(runner, state)]
    # what --strict-time fails: a step past STRICT_SLACK times its budget, or no budget row to hold it to
    failing = set(time_budget.over_budget(step_walls, budget, time_budget.STRICT_SLACK) if budget else findings)
    findings += gate_time.unexplained_slow(tests)  # reported, never failed: a slower machine must not fail it
    notes.insert(0, f"time budget: runner class {runner}, {state} cache" + (" (--strict-time)" if args.strict_time else ""))
    print("\nTime to verdict\n\n" + gate_time.write_table(args.report_dir, rows, wall, notes, gate_time.slowest(tests),
                                                          allowed, findings), flush=True)
    if all(c in (0, 1, 5) for c in codes.values()) and check_code in (0, 1):
        if cache.owned:  # nothing reads it while a run lasts: the next run orders its tests by it
            gate_time.write_tests(times, tests)
        compile_cache.seal(cache)
    code = verdict(list(codes.values()), check_code)
    if code == 0 and args.strict_time and failing:
        code = 1
    runs = [(final_verdict.read_junit(run, args.report_dir / f"junit-{run}.xml"), codes[run]) for run in PYTEST_RUNS]
    checks_done = [(step.layer, step.report(args.report_dir), check_codes[step.layer]) for step in checks.values()]
    time_lines = ([f + (" (fails the gate: --strict-time)" if f in failing else
                        f" (a finding: --strict-time fails past {time_budget.STRICT_SLACK:g}x)") if args.strict_time else f
                   for f in findings]
                  or [f"every step within its {runner} {state} budget ({wall['total']:.0f} s of {budget['whole']:.0f} s)"])
    print("\n" + final_verdict.render(code, runs, checks_done, time_lines, args.report_dir), flush=True)
    return code
