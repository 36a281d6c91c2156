"""The whole gate in one command, timed: `nox -s parity` runs this (python -m parity.gate).

    python -m parity.gate [--require-gpu] [--perf-matrix] [--workers N] [CHECK ARGS ...]

1. the persistent compile cache is validated and switched on (parity.compile_cache) before any
   child process starts, so pytest and the check both read and fill it;
2. `pytest tests` over every layer: on a machine with N > 1 GPUs and pytest-xdist installed,
   N workers, one GPU each (tests/conftest.py assigns them), tests that share built models kept on
   one worker (--dist loadgroup); one process otherwise;
3. `python -m parity check` on the embedded default (CHECK ARGS override, e.g. --stages fp32 bf16),
   in its own process: its models (the trained vit_tiny) are not those of the GPU layers (vit_b and
   vit_h, seeded), so running it inside pytest would share no build; what it reuses from pytest is the
   compile cache on disk, and its exit code keeps its meaning (2 = bad input);
4. reports/gate-time.md and .json: per layer the tests, their seconds and their compile seconds, and
   the wall time of each step; the cache is sealed when both steps finished.

Exit code: 2 when the check refused its input or pytest its arguments, else 1 when anything failed, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from parity import compile_cache, gate_time
from parity.gate_devices import visible_gpus

# The embedded default: the tiny SAM this project trained (samfast/weights) on generated scenes.
EMBEDDED_CHECK = ["--model", "vit_tiny", "--checkpoint", "trained", "--data", "scenes"]


def pytest_command(args, report_dir: Path, workers: int) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "tests", "--gate-time", str(report_dir / "gate-time-tests.json"),
           "--junitxml", str(report_dir / "junit-tests.xml")]
    if args.require_gpu:
        cmd.append("--require-gpu")
    if args.perf_matrix:
        cmd.append("--perf-matrix")
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "loadgroup"]
    return cmd


def choose_workers(requested: int | None, gpus: list[str], have_xdist: bool) -> tuple[int, str]:
    """(workers, why): one per GPU when xdist is there, never more workers than GPUs."""
    if requested is not None:
        if gpus and requested > len(gpus):
            raise SystemExit(f"error: --workers {requested} but {len(gpus)} GPU(s): at most one worker per GPU")
        if requested > 1 and not have_xdist:
            raise SystemExit("error: --workers > 1 needs pytest-xdist (pip install pytest-xdist)")
        return requested, "asked for"
    if len(gpus) > 1 and have_xdist:
        return len(gpus), f"one per GPU ({len(gpus)} GPUs)"
    if len(gpus) > 1:
        return 1, f"{len(gpus)} GPUs but pytest-xdist is not installed: one process"
    return 1, f"{len(gpus)} GPU(s): one process"


def run_check_step(check_args: list[str], out_json: Path) -> int:
    """`python -m parity check` in this process, then its compile seconds to out_json (the driver's child)."""
    from parity.cli import main

    try:
        code = main(["check", *check_args])
    except SystemExit as exit_:  # argparse: bad arguments
        code = exit_.code if isinstance(exit_.code, int) else 2
    out_json.write_text(json.dumps({"compile_seconds": round(gate_time.compile_seconds_so_far(), 3)}))
    return code


def _timed(cmd: list[str]) -> tuple[int, float]:
    print("+ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd)
    return code, time.perf_counter() - start


def verdict(pytest_code: int, check_code: int) -> int:
    if check_code == 2 or pytest_code in (3, 4):  # bad input / internal error or usage error of pytest
        return 2
    return 0 if pytest_code == 0 and check_code == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parity.gate", description=__doc__.split("\n")[0])
    parser.add_argument("--require-gpu", action="store_true", help="GPU tests fail instead of skipping without CUDA")
    parser.add_argument("--perf-matrix", action="store_true", help="time every budgets.toml row, not only the gating ones")
    parser.add_argument("--workers", type=int, help="pytest-xdist workers (default: one per GPU when there are several)")
    parser.add_argument("--report-dir", type=Path, default=Path("reports"))
    parser.add_argument("--_check-step", dest="check_step", type=Path, help=argparse.SUPPRESS)
    args, check_args = parser.parse_known_args(argv)
    if args.check_step:
        return run_check_step([*check_args, "--report-dir", str(args.report_dir)], args.check_step)

    args.report_dir.mkdir(parents=True, exist_ok=True)
    cache = compile_cache.activate()
    gpus = visible_gpus()
    workers, why = choose_workers(args.workers, gpus, importlib.util.find_spec("xdist") is not None)
    print(f"compile cache: {cache.path} ({'empty: cold run' if cache.started_empty else 'reused: warm run'}); "
          f"pytest workers: {workers} ({why})", flush=True)

    pytest_code, pytest_s = _timed(pytest_command(args, args.report_dir, workers))
    check_json = args.report_dir / "gate-time-check.json"
    check_json.unlink(missing_ok=True)
    check_code, check_s = _timed([sys.executable, "-m", "parity.gate", "--_check-step", str(check_json),
                                  "--report-dir", str(args.report_dir), *EMBEDDED_CHECK, *check_args])
    check_compile = json.loads(check_json.read_text())["compile_seconds"] if check_json.exists() else 0.0

    tests_json = args.report_dir / "gate-time-tests.json"
    tests = gate_time.read_tests(tests_json) if tests_json.exists() else []
    check_row = {"layer": "python -m parity check", "tests": 1, "failed": int(check_code != 0),
                 "seconds": round(check_s, 1), "compile_seconds": round(check_compile, 1)}
    rows = gate_time.summarize(tests, [check_row])
    wall = {"pytest": round(pytest_s, 1), "parity check": round(check_s, 1), "total": round(pytest_s + check_s, 1)}
    notes = [f"compile cache {'empty (cold)' if cache.started_empty else 'reused (warm)'}: {cache.path}",
             f"pytest workers: {workers} ({why})",
             f"exit codes: pytest {pytest_code}, parity check {check_code}"]
    print("\nTime to verdict\n\n" + gate_time.write_table(args.report_dir, rows, wall, notes), flush=True)
    if pytest_code in (0, 1) and check_code in (0, 1):
        compile_cache.seal(cache)
    return verdict(pytest_code, check_code)


if __name__ == "__main__":
    sys.exit(main())
