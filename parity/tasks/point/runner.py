"""The two jobs of the gate as Python calls: make a golden, and check stages against it.

The CLI (python -m parity) is a thin layer over these; tests call them directly, e.g. with a
`build` that perturbs weights to prove the check fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import samfast
from parity.compare.gates import StageResult
from parity.golden import manifest as golden_io
from parity.golden.data import Dataset
from parity.golden.distributed import SINGLE_PROCESS, RankFailure, Ranks, WorkFolder, failure, raise_first_failure
from parity.tasks import check
from parity.tasks.check import GoldenRef, TaskCheck
from parity.tasks.point import compare, report
from parity.tasks.point import golden as point_golden
from parity.tasks.point.pictures import worst_pictures
from parity.tasks.point.produce import StageOutputs, evaluate
from parity.tasks.source import ModelSource, default_device


def golden_folder(source: ModelSource, sha: str, dataset: Dataset, prompt: str, root: Path | None = None) -> Path:
    return (root or golden_io.GOLDEN_ROOT) / golden_io.golden_dir_name(source.model_type, source.dir_id(sha), dataset.name, dataset.limit, prompt)


def run_identity(task: str, source: ModelSource, sha: str, dataset: Dataset, prompt: str, batch_size: int,
                 stage: str, device: torch.device) -> dict:
    """What a resumed run must share with the one that left its batches (parity.golden.distributed.WorkFolder)."""
    return {"task": task, "model_type": source.model_type, "checkpoint_sha256": sha,
            "dataset_fingerprint": dataset.fingerprint, "prompt": prompt, "batch_size": batch_size, "stage": stage,
            "samfast_version": samfast.__version__, "torch_version": torch.__version__,
            "device": golden_io.device_description(device)}


def make_golden(source: ModelSource, dataset: Dataset, *, prompt: str = "point", device=None,
                batch_size: int = 8, root: Path | None = None, ranks: Ranks = SINGLE_PROCESS) -> Path | None:
    """Evaluate fp32 and publish the golden (rank 0 alone; other ranks return None); refuse (exit 2, the
    old golden untouched) one that would check nothing. Finished batches are kept in
    golden/.<name>.work/ until the golden is published, so a re-run after a kill resumes."""
    if batch_size < 1:
        raise samfast.InputError(f"--batch-size must be at least 1, got {batch_size}")
    if not dataset.num_annotations:
        raise golden_io.UselessGolden(
            f"dataset {dataset.name} has no annotations left after filtering ({dataset.crowd_skipped} crowd, "
            f"{dataset.empty_skipped} empty skipped): a golden of it would check nothing; no golden written")
    device = torch.device(device) if device else default_device()
    with golden_io.fp32_settings() as settings:
        sha = source.sha256()
        folder = golden_folder(source, sha, dataset, prompt, root)
        work = WorkFolder(folder.with_name(f".{folder.name}.work"),
                          run_identity("golden", source, sha, dataset, prompt, batch_size, "fp32", device), ranks)
        model = source.build("fp32", device, batch_size)
        outputs = evaluate(model, dataset, prompt=prompt, batch_size=batch_size, desc=f"golden {source.model_type} fp32",
                           ranks=ranks, work=work)
        if not ranks.is_main:
            return None
        try:
            refuse_useless(outputs, source)
        except golden_io.UselessGolden:
            work.remove()  # nothing in it is worth resuming from
            raise
        manifest = golden_io.base_manifest(source.model_type, source.label, sha, dataset, prompt, device)
        manifest.update(fp32_settings=settings, masks_meaningful=source.masks_meaningful, batch_size=batch_size)
        written = point_golden.write_golden(folder, outputs, manifest)
        work.remove()
        return written


def refuse_useless(outputs: StageOutputs, source: ModelSource) -> None:
    """No golden of zero annotations or of non-finite scores or logits (NaN weights): name the first bad one."""
    if not outputs.annotations:
        raise golden_io.UselessGolden("the fp32 run produced no annotations: a golden of it would check nothing; no golden written")
    for ann in outputs.annotations:
        logits = outputs.logits.get(ann.ann_id)
        if not np.isfinite(ann.scores).all() or (logits is not None and not np.isfinite(logits).all()):
            raise golden_io.UselessGolden(
                f"annotation {ann.ann_id} (image {ann.image_id}) has non-finite predicted IoUs or logits with "
                f"{source.label}: the weights or the input are broken; no golden written")


def regenerate_command(source: ModelSource, data_args: str, prompt: str) -> str:
    return f"python -m parity golden {source.cli_args()} {data_args}" + (f" --prompt {prompt}" if prompt != "point" else "")


@dataclass
class PointCheck(TaskCheck):
    """The point task's part of the check loop (parity.tasks.check): one prompt per annotation through the
    batched predictor, its batches shared among ranks and kept in report_dir/.<stage>.work/ until the
    reports are written, so a re-run after a kill resumes (a custom `custom_build` is not resumable:
    nothing identifies it)."""

    source: ModelSource
    dataset: Dataset
    data_args: str
    prompt: str
    device: torch.device
    batch_size: int
    golden: Path | None
    report_dir: Path
    custom_build: Callable[[str], torch.nn.Module] | None
    ranks: Ranks
    works: list[WorkFolder] = field(default_factory=list)

    @cached_property
    def sha(self) -> str:
        return self.source.sha256()

    def locate_golden(self) -> GoldenRef:
        folder = Path(self.golden) if self.golden else golden_folder(self.source, self.sha, self.dataset, self.prompt)
        expected = {
            "model_type": self.source.model_type,
            "checkpoint_sha256": self.sha,
            "dataset_fingerprint": self.dataset.fingerprint,
            "prompt_policy": self.dataset.manifest()["prompt_policy" if self.prompt == "point" else "box_policy"],
        }
        return GoldenRef(folder, regenerate_command(self.source, self.data_args, self.prompt), expected)

    def read_golden(self, folder: Path, regenerate: str) -> tuple[dict, StageOutputs]:
        return point_golden.read_golden(folder, regenerate)

    def build(self, stage: str) -> torch.nn.Module:
        build = self.custom_build or (lambda stages: self.source.build(stages, self.device, self.batch_size))
        return _build_on_every_rank(build, stage, self.ranks)

    def produce(self, model: torch.nn.Module, stage: str, limits: dict) -> StageOutputs:
        work = None
        if self.custom_build is None:
            work = WorkFolder(Path(self.report_dir) / f".{stage}.work",
                              run_identity("check", self.source, self.sha, self.dataset, self.prompt, self.batch_size,
                                           stage, self.device), self.ranks)
            self.works.append(work)
        return evaluate(model, self.dataset, prompt=self.prompt, batch_size=self.batch_size, desc=f"check {stage}",
                        ranks=self.ranks, work=work)

    def compare(self, stage: str, outputs: StageOutputs, golden: StageOutputs, limits: dict) -> StageResult:
        return compare.compare(stage, outputs, golden, limits, self.source.masks_meaningful)

    def pictures(self, result: StageResult, outputs: StageOutputs, golden: StageOutputs) -> dict[int, bytes]:
        return worst_pictures(result, self.dataset, self.prompt)

    def header(self, ref: GoldenRef, manifest: dict) -> dict:
        return {
            "model_type": self.source.model_type,
            "checkpoint": self.source.label,
            "dataset": f"{self.dataset.name} ({len(self.dataset.samples)} images)",
            "annotations": self.dataset.num_annotations,
            "prompt": self.prompt,
            **golden_io.provenance(ref.folder, manifest, self.device),
            "masks_meaningful": self.source.masks_meaningful,
        }

    def write_reports(self, folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
        return report.write_reports(folder, header, results)

    def stage_error(self, err: Exception) -> str | None:
        # a stage that cannot run here fails alone; bad data, or a rank that lost its peers, stops the check
        if isinstance(err, RankFailure) and err.agreed and not err.bad_input:
            return str(err)
        return None

    def finish(self) -> None:
        for work in self.works:
            work.remove()


def run_check(
    source: ModelSource,
    dataset: Dataset,
    stages: list[str],
    *,
    data_args: str,
    prompt: str = "point",
    device=None,
    batch_size: int = 8,
    golden: Path | None = None,
    report_dir: Path = Path("reports"),
    build: Callable[[str], torch.nn.Module] | None = None,
    ranks: Ranks = SINGLE_PROCESS,
    require_gpu: bool = False,
) -> tuple[list[StageResult], dict[str, Path]] | None:
    """Check each stage against the golden (parity.tasks.check.run_check); write report.md/json/html,
    junit.xml and a plot (rank 0; the other ranks return None). `build(stage)` replaces the model (tests
    plant defects through it)."""
    device = torch.device(device) if device else default_device()
    task = PointCheck(source, dataset, data_args, prompt, device, batch_size, golden, report_dir, build, ranks)
    return check.run_check(task, stages, report_dir=report_dir, require_gpu=require_gpu, ranks=ranks)


def _build_on_every_rank(build: Callable[[str], torch.nn.Module], stage: str, ranks: Ranks) -> torch.nn.Module:
    """The stage's model; when any rank cannot build it, every rank raises RankFailure alike."""
    model = problem = None
    try:
        model = build(stage)
    except Exception as err:
        problem = failure(ranks, f"building the model: {type(err).__name__}: {err}", bad_input=False)
    raise_first_failure(ranks.all_gather(problem))
    return model
