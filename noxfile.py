"""Sessions: tests (CPU-safe layers), parity (the gate), golden (regenerate), bench (GPU), train-tiny (GPU).

Every session runs in the current Python environment (python=False) and first installs this
project with its test extra there: torch is several GB, and a fresh virtualenv per session would
download or copy it again each time.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nox

# The sessions import parity (the gate's worker choice, the goldens' task registry) from this checkout.
# Installing the project puts it on the path of new processes only, not of this one, which nox started
# before the install: a fresh clone in a fresh environment would not find it.
sys.path.insert(0, str(Path(__file__).resolve().parent))

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "none"



# What the project and its test layers import: when all of it is importable already (a GPU runner's
# image, a machine without internet), installing would only risk a download, so it is skipped.
_NEEDED = ["torch", "torchao", "pycocotools", "numpy", "PIL", "tqdm", "matplotlib", "pytest",
           "pytest_benchmark", "segment_anything", "sam2", "sam3", "open_clip", "psutil", "torchvision", "samfast",
           "parity"]


def _install(session: nox.Session) -> None:
    probe = "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    try:
        session.run("python", "-c", probe, *_NEEDED, external=True, silent=True)
    except nox.command.CommandFailed:
        # SAM2_BUILD_CUDA=0: the sam2 reference's optional CUDA extension is not built (nothing here needs it)
        session.run("python", "-m", "pip", "install", "-q", "-e", ".[test]", external=True, env={"SAM2_BUILD_CUDA": "0"})
    else:
        session.log("project and test dependencies already importable: not installing")


def _xdist_workers(posargs: list[str]) -> list[str]:
    """One pytest-xdist worker per core, chosen as the gate's CPU layers choose theirs
    (parity.gate.run.choose_cpu_workers): on CI's two cores a single process leaves one idle. Tests sharing a
    module's models stay on one worker (--dist loadgroup, parity.gate.worker_groups). None when the caller
    chose (-n, -p no:xdist) or there is one core.

    Every core is spare here: the gate keeps one back (parity.gate.run.spare_cores) for the steps it runs
    beside its CPU layers, and this session runs nothing beside them."""
    importlib.invalidate_caches()  # what the session's install just added to site-packages
    from parity.gate.run import choose_cpu_workers
    from parity.gate.threads import available_cores

    cores = available_cores()
    chosen = any(a == "-n" or a.startswith(("-n", "--numprocesses")) or a == "no:xdist" for a in posargs)
    workers = choose_cpu_workers(None, cores, importlib.util.find_spec("xdist") is not None)
    if chosen or workers < 2:
        return []
    return ["-n", str(workers), "--dist", "loadgroup"]


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The CPU-safe layers: unit, parity on vit_tiny, compile checks, checkers on fixtures. GPU tests skip.

    Arguments after -- replace the selection (`nox -s tests -- tests/unit/test_amg.py -k nms` runs only
    those; pytest's testpaths keep `tests` when they name options only). Over one xdist worker per core
    unless they choose (-n 0 for one process), with glibc's malloc keeping big tensors on its heap
    (parity.gate.allocator)."""
    _install(session)
    from parity.gate.allocator import heap_env  # as the gate's CPU layers run: big tensors from the heap

    session.run("python", "-m", "pytest", *(session.posargs or ["tests"]), *_xdist_workers(session.posargs),
                env=heap_env())


@nox.session(python=False)
def parity(session: nox.Session) -> None:
    """The gate, timed (python -m parity.gate): the layered suite, then `python -m parity check` on the embedded default.

    `nox -s parity -- --require-gpu` turns GPU skips into failures (for GPU runners that gate PRs);
    --perf-matrix times every budgets.toml row; --workers N overrides one pytest-xdist worker per GPU;
    other arguments after `--` go to `python -m parity check` (e.g. --stages fp32 bf16).
    Writes reports/gate-time.md (seconds per layer) beside the check's reports; compile caches
    persist in SAMFAST_CACHE_DIR (default ~/.cache/samfast).
    """
    _install(session)
    session.run("python", "-m", "parity.gate", *session.posargs)


@nox.session(python=False)
def golden(session: nox.Session) -> None:
    """Regenerate golden fp32 outputs (default: every task's embedded goldens, parity.tasks.registry: point,
    AMG and video for vit_tiny and the SAM 2 nano, concept for the reduced SAM 3; arguments after -- override)."""
    _install(session)
    if session.posargs:
        session.run("python", "-m", "parity", "golden", *session.posargs)
        return
    from parity.tasks.registry import TASKS

    for task in TASKS.values():
        for check in task.embedded:
            session.run("python", "-m", "parity", "golden", *check.golden_args())


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """GPU benchmark of the ladder (markdown + JSON + PNG under reports/bench)."""
    _install(session)
    session.run("python", "-m", "bench.ladder", *session.posargs)


# Each family's packaged training run, the command that makes its committed checkpoint in
# samfast/weights (vit_tiny's manifest records it as `python -m parity.train_tiny`, the trainer's home
# before it moved to tinysam/). sam2.1_hiera_nano's fits a 6-minute GPU lease: --minutes bounds the
# whole run, data generation, the first steps' compiling and the final validation included.
PACKAGED_TRAINING = {
    "vit_tiny": ["--minutes", "9.3", "--pool", "6000", "--val-every", "60", "--out", "samfast/weights"],
    "sam2.1_hiera_nano": ["--model", "sam2.1_hiera_nano", "--minutes", "5.5", "--pool", "3000", "--val-every", "60",
                          "--out", "samfast/weights"],
    "sam3_tiny": ["--minutes", "7", "--pool", "3000", "--batch", "32", "--out", "samfast/weights"],
}
# The trainer of each packaged checkpoint that tinysam.train does not make: SAM 3 finds concepts, not prompts
TRAINERS = {"sam3_tiny": "tinysam.train_concept"}
# The packaged nano is the image run's file with its video modules then trained on generated clips
# (tinysam.train_tracking, 8.5 minutes on a GPU), which replaces it in place.
PACKAGED_TRACKING = {"sam2.1_hiera_nano": ["--minutes", "8.5", "--out", "samfast/weights"]}


@nox.session(name="train-tiny", python=False)
def train_tiny(session: nox.Session) -> None:
    """Train a packaged checkpoint from scratch on generated scenes (GPU): vit_tiny by default (9 minutes
    on an H100), `-- --model sam2.1_hiera_nano` for the small SAM 2 (5.5 minutes, then 8.5 training its
    video modules: PACKAGED_TRACKING), `-- --model sam3_tiny` for the small SAM 3 (7 minutes,
    tinysam.train_concept; no run has made a file worth packaging yet: docs/sam3.md).

    Writes samfast/weights/<model>_trained.{pt,json} and the run's log csv and curve png.
    With no arguments, or only `--model NAME`, it runs that family's packaged command (PACKAGED_TRAINING);
    other arguments after -- go to `python -m tinysam.train` as they are (e.g. --minutes 5 --seed 0;
    --smoke on a CPU; add --model for the SAM 2 family).
    """
    _install(session)
    args = session.posargs or PACKAGED_TRAINING["vit_tiny"]
    tracking, trainer = None, "tinysam.train"
    if len(args) == 2 and args[0] == "--model" and args[1] in PACKAGED_TRAINING:
        model = args[1]
        args, tracking, trainer = PACKAGED_TRAINING[model], PACKAGED_TRACKING.get(model), TRAINERS.get(model, trainer)
    session.run("python", "-m", trainer, *args)
    if tracking:
        session.run("python", "-m", "tinysam.train_tracking", *tracking)
