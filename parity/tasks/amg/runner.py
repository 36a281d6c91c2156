"""The gate's two jobs for segment-everything: make an AMG golden, check stages against it.

Mirrors parity.tasks.point.runner (the point-prompt task) and shares its ModelSource; the CLI reaches these
with `--task amg`. Images go through the generator one at a time, so models are built for batch 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from parity.compare.gates import StageResult
from parity.golden import manifest as golden_io
from parity.golden.data import Dataset
from parity.tasks import check
from parity.tasks.amg import compare, report
from parity.tasks.amg import golden as amg_golden
from parity.tasks.amg.pictures import worst_pictures
from parity.tasks.amg.produce import IGNORED_SWITCHES, AmgParams, Generated, generate, make_generator
from parity.tasks.check import GoldenRef, TaskCheck
from parity.tasks.source import ModelSource, default_device

POINTS_PER_BATCH = 64  # the reference's default; it splits work into decoder calls, never changes masks


def golden_folder(source: ModelSource, sha: str, dataset: Dataset, root: Path | None = None) -> Path:
    return (root or golden_io.GOLDEN_ROOT) / amg_golden.folder_name(source.model_type, source.dir_id(sha), dataset)


def regenerate_command(source: ModelSource, data_args: str, params: AmgParams) -> str:
    return " ".join(filter(None, ["python -m parity golden --task amg", source.cli_args(), data_args, params.cli_args()]))


def _build(source: ModelSource, stages: str, device: torch.device,
           build: Callable[[str], torch.nn.Module] | None = None) -> torch.nn.Module:
    return build(stages) if build else source.build(stages, device, 1)


def _run(model: torch.nn.Module, params: AmgParams, points_per_batch: int, dataset: Dataset, desc: str,
         alternates_within: float | None = None) -> Generated:
    return generate(make_generator(model, params, points_per_batch, alternates_within), dataset, desc)


def make_golden(source: ModelSource, dataset: Dataset, params: AmgParams, *, device=None,
                points_per_batch: int = POINTS_PER_BATCH, root: Path | None = None) -> Path:
    device = torch.device(device) if device else default_device()
    with golden_io.fp32_settings() as settings:
        sha = source.sha256()
        generated = _run(_build(source, "fp32", device), params, points_per_batch, dataset,
                         f"AMG golden {source.model_type} fp32")
        amg_golden.refuse_useless(generated.images, "lower --pred-iou-thresh / --stability-score-thresh")
        manifest = golden_io.base_manifest(source.model_type, source.label, sha, dataset, "point", device)
        manifest.update(fp32_settings=settings, masks_meaningful=source.masks_meaningful, amg_params=params.as_dict(),
                        points_per_batch=points_per_batch)
        return amg_golden.publish(golden_folder(source, sha, dataset, root), generated, manifest)


@dataclass
class AmgCheck(TaskCheck):
    """The segment-everything task's part of the check loop (parity.tasks.check): the generator over every
    image, one at a time, its masks matched one to one with the golden's."""

    source: ModelSource
    dataset: Dataset
    params: AmgParams
    data_args: str
    device: torch.device
    points_per_batch: int
    golden: Path | None
    custom_build: Callable[[str], torch.nn.Module] | None

    thresholds_table = "amg"
    ignored_switches = IGNORED_SWITCHES

    def locate_golden(self) -> GoldenRef:
        sha = self.source.sha256()
        folder = Path(self.golden) if self.golden else golden_folder(self.source, sha, self.dataset)
        expected = {"model_type": self.source.model_type, "checkpoint_sha256": sha,
                    "dataset_fingerprint": self.dataset.fingerprint, "prompt_policy": amg_golden.GRID_POLICY}
        return GoldenRef(folder, regenerate_command(self.source, self.data_args, self.params), expected)

    def read_golden(self, folder: Path, regenerate: str) -> tuple[dict, dict[int, list[dict]]]:
        return amg_golden.read(folder, regenerate)

    def verify_golden(self, manifest: dict, ref: GoldenRef) -> None:
        amg_golden.verify_params(manifest, self.params, ref.folder, ref.regenerate)

    def build(self, stage: str) -> torch.nn.Module:
        return _build(self.source, stage, self.device, self.custom_build)

    def produce(self, model: torch.nn.Module, stage: str, limits: dict) -> Generated:
        # with the masks NMS dropped at a near tie, which rounding may have swapped with the golden's
        return _run(model, self.params, self.points_per_batch, self.dataset, f"AMG check {stage}",
                    alternates_within=limits["max_score_abs_err"])

    def compare(self, stage: str, generated: Generated, golden: dict[int, list[dict]], limits: dict) -> StageResult:
        result = compare.compare(stage, generated.images, golden, limits, self.params, generated.alternates)
        if result.summary:
            result.summary.update(seconds=generated.seconds, ms_per_image=generated.ms_per_image)
        return result

    def pictures(self, result: StageResult, generated: Generated, golden: dict[int, list[dict]]) -> dict[int, bytes]:
        return worst_pictures(result, self.dataset, golden, generated.images)

    def header(self, ref: GoldenRef, manifest: dict) -> dict:
        return {
            "model_type": self.source.model_type,
            "checkpoint": self.source.label,
            "dataset": f"{self.dataset.name} ({len(self.dataset.samples)} images)",
            "amg_params": self.params.as_dict(),
            "points_per_batch": self.points_per_batch,
            "golden_masks": manifest.get("masks"),
            **golden_io.provenance(ref.folder, manifest, self.device),
        }

    def write_reports(self, folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
        return report.write_reports(folder, header, results)


def run_check(
    source: ModelSource,
    dataset: Dataset,
    stages: list[str],
    params: AmgParams,
    *,
    data_args: str,
    device=None,
    points_per_batch: int = POINTS_PER_BATCH,
    golden: Path | None = None,
    report_dir: Path = Path("reports/amg"),
    build: Callable[[str], torch.nn.Module] | None = None,
    require_gpu: bool = False,
) -> tuple[list[StageResult], dict[str, Path]]:
    """Check each stage's generated masks against the AMG golden (parity.tasks.check.run_check); write
    report.md/json, junit.xml and a plot. `build(stage)` replaces the model (tests plant defects through it)."""
    device = torch.device(device) if device else default_device()
    task = AmgCheck(source, dataset, params, data_args, device, points_per_batch, golden, build)
    return check.run_check(task, stages, report_dir=report_dir, require_gpu=require_gpu)
