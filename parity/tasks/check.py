"""The one check loop of every task: each stage against the task's fp32 golden, then the reports.

    results, paths = run_check(PointCheck(...), stages, report_dir=Path("reports"), require_gpu=False)

The loop owns what every task's check does alike: remove the previous reports, switch TF32 off, read the
golden and refuse one made for another model, data or prompt policy, load the task's thresholds; then per
stage release the GPU cache, parse the stage, watch its switches (parity.checks.exercised) while it is built
and run, compare, record what the switches did and the kernel fallbacks, draw the pictures of a failed or
near-failing stage; then the header and the reports. A task supplies a `TaskCheck`: where its golden is and
how it is read, how a stage is built and run, compared and drawn, and what its report's header says.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from parity.checks.exercised import NOTHING_IGNORED, watch_switches
from parity.compare.gates import StageResult, load_thresholds, thresholds_for
from parity.golden import manifest as golden_io
from parity.golden.distributed import SINGLE_PROCESS, Ranks
from parity.report.verdicts import remove_reports
from parity.tasks.source import release_gpu_cache
from samfast.stages import canonical_name, parse_stages


@dataclass(frozen=True)
class GoldenRef:
    """Which golden a check reads: its folder, the command that remakes it (every refusal names it), and
    the manifest's identity fields this run must match (parity.golden.manifest.verify_matches)."""

    folder: Path
    regenerate: str
    expected: dict


class TaskCheck(ABC):
    """What one task's check of one model on one data set supplies to `run_check`."""

    thresholds_table: str = "accuracy"  # its [<table>.<precision>] rows in parity/budgets.toml
    ignored_switches: Mapping[str, str] = NOTHING_IGNORED  # switch -> why its run never reads it

    def refuse_stages(self, stages: list[str]) -> None:
        """Refuse (bad input, exit 2) stages this task cannot build, before any work; every stage by default."""

    @abstractmethod
    def locate_golden(self) -> GoldenRef: ...

    @abstractmethod
    def read_golden(self, folder: Path, regenerate: str) -> tuple[dict, Any]:
        """The manifest and the golden's outputs, every byte verified (parity.golden.store)."""

    def verify_golden(self, manifest: dict, ref: GoldenRef) -> None:
        """Refuse a golden that matches this run's identity but answers another question (other parameters)."""

    @abstractmethod
    def build(self, stage: str) -> Any:
        """The stage's model, or what runs it (the video task's predictor: `model_of` finds the model)."""

    def model_of(self, built: Any) -> torch.nn.Module:
        """The model in what `build` returned, whose switches are watched."""
        return built

    @abstractmethod
    def produce(self, built: Any, stage: str, limits: dict) -> Any:
        """The stage's outputs over the task's data (`stage`: its canonical name, `limits`: its thresholds)."""

    @abstractmethod
    def compare(self, stage: str, outputs: Any, golden: Any, limits: dict) -> StageResult: ...

    @abstractmethod
    def pictures(self, result: StageResult, outputs: Any, golden: Any) -> dict[int, bytes]:
        """PNGs of a failed or near-failing stage's worst items, keyed as the task's report names them."""

    @abstractmethod
    def header(self, ref: GoldenRef, manifest: dict) -> dict:
        """The report's facts about the run: model, weights, data, the golden's provenance."""

    @abstractmethod
    def write_reports(self, folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]: ...

    def stage_error(self, err: Exception) -> str | None:
        """Why a stage that raised `err` could not run (a failed stage, reported with it); None when `err`
        must stop the whole check instead."""
        return f"{type(err).__name__}: {err}"

    def finish(self) -> None:
        """After the reports are written (the point task removes the stages' resumable work)."""


def run_check(task: TaskCheck, stages: list[str], *, report_dir: Path, require_gpu: bool = False,
              ranks: Ranks = SINGLE_PROCESS) -> tuple[list[StageResult], dict[str, Path]] | None:
    """Check each stage against the task's golden; write the task's reports into report_dir (rank 0; the
    other ranks return None). A stage whose switch did not run (parity.checks.exercised) is "not
    exercised", or failed with `require_gpu`."""
    if ranks.is_main:  # first of all: a check that stops on bad input or crashes leaves no earlier PASS behind
        remove_reports(Path(report_dir))
    task.refuse_stages(stages)
    golden_io.no_tf32()  # the stages' own switches set the precision; fp32 is compared as the golden ran it
    ref = task.locate_golden()
    manifest, golden = task.read_golden(ref.folder, ref.regenerate)
    golden_io.verify_matches(manifest, ref.expected, ref.folder, ref.regenerate)
    task.verify_golden(manifest, ref)
    thresholds = load_thresholds(table=task.thresholds_table)
    results = []
    for stage in stages:
        release_gpu_cache()
        switches = parse_stages(stage)
        name = canonical_name(switches)
        limits = thresholds_for(stage, thresholds)
        try:
            with watch_switches(switches, task.ignored_switches) as used:
                built = task.build(stage)
                used.watch(task.model_of(built))
                outputs = task.produce(built, name, limits)
        except Exception as err:  # noqa: BLE001 (the task decides which errors fail only their stage)
            error = task.stage_error(err)
            if error is None:
                raise
            results.append(StageResult(name, [], {}, error=error))
            continue
        if not ranks.is_main:
            continue
        result = task.compare(name, outputs, golden, limits)
        if not result.error:  # visible, not silent: calls a fused kernel could not serve and sent to the slow path
            result.summary["kernel_fallbacks"] = used.kernel_fallbacks
        used.record(result, require_gpu)
        if result.failures or result.near_failing:
            result.pictures = task.pictures(result, outputs, golden)
        result.worst_masks = {}  # the pictures are made: nothing else needs the masks
        results.append(result)
    if not ranks.is_main:
        return None
    paths = task.write_reports(Path(report_dir), task.header(ref, manifest), results)
    task.finish()
    return results, paths
