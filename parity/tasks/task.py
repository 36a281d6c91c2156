"""The one shape every task of the gate has (point prompts, segment everything, video).

A task lives in parity/tasks/<name>/, in modules of the same names in every task: what its golden stores
(golden.py), how a stage makes its outputs (produce.py), how they are compared with the golden's
(compare.py), its pictures of a stage's worst items (pictures.py), what its report shows (report.py), its
golden and its part of the one check loop (runner.py, parity/tasks/check.py), its embedded default checks
(embedded.py), and its planted defects (tests that make its comparison fail). It reaches the CLI, the gate
and `nox -s golden` through one `Task` value in its task.py, listed in parity/tasks/registry.py:
`python -m parity golden|check --task <name>` dispatches there, the gate runs its embedded checks, and
adding a task touches no other task.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from parity.compare.gates import StageResult
from parity.golden.data import Dataset
from parity.golden.distributed import Ranks
from parity.tasks.source import ModelSource
from samfast.stages import SWITCHES

# make_golden(args, source, dataset, device, ranks) -> what was written, one line (None on ranks other than 0)
MakeGolden = Callable[[argparse.Namespace, ModelSource, Dataset, torch.device, Ranks], "str | None"]
# run_check(args, source, dataset, data_args, stages, device, ranks) -> (results, report paths), None off rank 0
RunCheck = Callable[[argparse.Namespace, ModelSource, Dataset, str, list, torch.device, Ranks],
                    "tuple[list[StageResult], dict[str, Path]] | None"]


def positive_int(text: str) -> int:
    """argparse type of a count: a whole number >= 1, refused in one line otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


@dataclass(frozen=True)
class EmbeddedCheck:
    """One of a task's embedded default checks (its arguments in the task's embedded.py): the gate runs
    `python -m parity check` with them beside its pytest layers (parity.gate.run), `nox -s golden` remakes
    their golden. Each argument list names the task (the point task's by leaving --task out)."""

    step: str  # the gate's name for it: its log reports/<step>.log, its [gate_time.*] budget key
    layer: str  # its row in the gate's time table and its line in the verdict
    golden: tuple[str, ...]  # `python -m parity golden` arguments; with a GPU the check's (every default GPU stage)
    check: tuple[str, ...] | None = None  # `python -m parity check` arguments without a GPU; None: the golden's
    golden_on_cpu: bool = False  # nox -s golden makes the golden with --device cpu
    report_dir: str = ""  # below the gate's --report-dir: two checks of one task must not share a folder

    def check_args(self, gpu: bool) -> tuple[str, ...]:
        return self.golden if gpu or self.check is None else self.check

    def golden_args(self) -> tuple[str, ...]:
        return (*self.golden, *(("--device", "cpu") if self.golden_on_cpu else ()))


@dataclass(frozen=True)
class Task:
    name: str
    help: str  # one line for `--task`'s help
    golden_files: tuple[str, ...]  # the content files its golden stores beside manifest.json
    add_arguments: Callable[[argparse.ArgumentParser], list[str]]  # its own flags; returns their dests
    make_golden: MakeGolden
    run_check: RunCheck
    planted_defects: tuple[str, ...]  # pytest node ids of the tests that show its comparison failing
    one_process: bool = False  # True: refuses --nproc
    # False: the task reads its own data from --data (video: clips or DAVIS folders), so the CLI loads no
    # COCO dataset for it and hands its make_golden and run_check None
    reads_coco: bool = True
    # switch -> why its run never reads it: "not applicable" in its reports, never proven (its run_check
    # hands the same mapping to parity.checks.exercised.watch_switches)
    ignored_switches: Mapping[str, str] = field(default_factory=dict)
    report_folder: str = ""  # below --report-dir, where its check writes its reports ("amg": reports/amg/)
    embedded: tuple[EmbeddedCheck, ...] = ()  # what the gate checks and `nox -s golden` remakes

    @property
    def switches(self) -> frozenset[str]:
        """The switches its run reads."""
        return frozenset(SWITCHES) - self.ignored_switches.keys()

    def validate(self, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
        """Refuse (exit 2, through parser.error) what this task cannot run."""
        if self.one_process and args.nproc not in (None, 1):
            parser.error(f"--task {self.name} runs in one process; drop --nproc")
