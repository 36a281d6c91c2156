"""The gate's two jobs for concept segmentation (SAM 3): make a concept golden, check stages against it.

Mirrors parity.tasks.amg.runner and shares its ModelSource; the CLI reaches these with `--task concept`.
Each image goes through Sam3Processor.predict_batch with every phrase at once, so models are built for batch 1.
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
from parity.tasks.check import GoldenRef, TaskCheck
from parity.tasks.concept import compare, report
from parity.tasks.concept import golden as concept_golden
from parity.tasks.concept.ground_truth import concept_f1
from parity.tasks.concept.pictures import worst_pictures
from parity.tasks.concept.produce import IGNORED_SWITCHES, Detected, detect, phrases_of
from parity.tasks.source import ModelSource, default_device

DEFAULT_CONFIDENCE_THRESHOLD = 0.5  # Sam3Processor's default, and the threshold cgF1 is defined at


def golden_folder(source: ModelSource, sha: str, dataset: Dataset, root: Path | None = None) -> Path:
    return (root or golden_io.GOLDEN_ROOT) / concept_golden.folder_name(source.model_type, source.dir_id(sha), dataset)


def regenerate_command(source: ModelSource, data_args: str, confidence_threshold: float) -> str:
    threshold = ("" if confidence_threshold == DEFAULT_CONFIDENCE_THRESHOLD
                 else f"--confidence-threshold {confidence_threshold:g}")
    return " ".join(filter(None, ["python -m parity golden --task concept", source.cli_args(), data_args, threshold]))


def _build(source: ModelSource, stages: str, device: torch.device,
           build: Callable[[str], torch.nn.Module] | None = None) -> torch.nn.Module:
    return build(stages) if build else source.build(stages, device, 1)


def make_golden(source: ModelSource, dataset: Dataset, confidence_threshold: float, *, device=None,
                root: Path | None = None) -> Path:
    device = torch.device(device) if device else default_device()
    phrases = phrases_of(dataset)
    with golden_io.fp32_settings() as settings:
        sha = source.sha256()
        detected = detect(_build(source, "fp32", device), dataset, phrases, confidence_threshold,
                          f"concept golden {source.model_type} fp32")
        concept_golden.refuse_useless(detected.images, "Lower --confidence-threshold, or use trained weights.")
        manifest = golden_io.base_manifest(source.model_type, source.label, sha, dataset, "point", device)
        manifest.update(fp32_settings=settings, masks_meaningful=source.masks_meaningful,
                        confidence_threshold=confidence_threshold, phrases=phrases,
                        ground_truth=concept_f1(dataset, detected.images, confidence_threshold).as_dict())
        return concept_golden.publish(golden_folder(source, sha, dataset, root), detected, manifest)


@dataclass
class ConceptCheck(TaskCheck):
    """The concept task's part of the check loop (parity.tasks.check): every phrase on every image, each
    (image, phrase)'s detections paired with the golden's by query."""

    source: ModelSource
    dataset: Dataset
    confidence_threshold: float
    data_args: str
    device: torch.device
    golden: Path | None
    custom_build: Callable[[str], torch.nn.Module] | None

    thresholds_table = "concept"
    ignored_switches = IGNORED_SWITCHES

    def locate_golden(self) -> GoldenRef:
        sha = self.source.sha256()
        folder = Path(self.golden) if self.golden else golden_folder(self.source, sha, self.dataset)
        expected = {"model_type": self.source.model_type, "checkpoint_sha256": sha,
                    "dataset_fingerprint": self.dataset.fingerprint, "prompt_policy": concept_golden.PHRASE_POLICY}
        return GoldenRef(folder, regenerate_command(self.source, self.data_args, self.confidence_threshold), expected)

    def read_golden(self, folder: Path, regenerate: str) -> tuple[dict, dict[int, list[dict]]]:
        return concept_golden.read(folder, regenerate)

    def verify_golden(self, manifest: dict, ref: GoldenRef) -> None:
        concept_golden.verify_params(manifest, self.confidence_threshold, phrases_of(self.dataset), ref.folder,
                                     ref.regenerate)

    def build(self, stage: str) -> torch.nn.Module:
        return _build(self.source, stage, self.device, self.custom_build)

    def produce(self, model: torch.nn.Module, stage: str, limits: dict) -> Detected:
        return detect(model, self.dataset, phrases_of(self.dataset), self.confidence_threshold, f"concept check {stage}")

    def compare(self, stage: str, detected: Detected, golden: dict[int, list[dict]], limits: dict) -> StageResult:
        result = compare.compare(stage, detected.images, golden, limits, self.source.masks_meaningful)
        if result.summary:
            truth = concept_f1(self.dataset, detected.images, self.confidence_threshold)
            result.summary.update(cgf1=truth.cgf1, il_mcc=truth.il_mcc, pmf1=truth.pmf1,
                                  seconds=detected.seconds, ms_per_image=detected.ms_per_image)
        return result

    def pictures(self, result: StageResult, detected: Detected, golden: dict[int, list[dict]]) -> dict[int, bytes]:
        return worst_pictures(result, self.dataset, golden, detected.images)

    def header(self, ref: GoldenRef, manifest: dict) -> dict:
        return {
            "model_type": self.source.model_type,
            "checkpoint": self.source.label,
            "masks_meaningful": self.source.masks_meaningful,
            "dataset": f"{self.dataset.name} ({len(self.dataset.samples)} images)",
            "phrases": phrases_of(self.dataset),
            "confidence_threshold": self.confidence_threshold,
            "golden_pairs": manifest.get("pairs"),
            "golden_detections": manifest.get("detections"),
            "golden_ground_truth": manifest.get("ground_truth"),
            **golden_io.provenance(ref.folder, manifest, self.device),
        }

    def write_reports(self, folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
        return report.write_reports(folder, header, results)


def run_check(
    source: ModelSource,
    dataset: Dataset,
    stages: list[str],
    confidence_threshold: float,
    *,
    data_args: str,
    device=None,
    golden: Path | None = None,
    report_dir: Path = Path("reports/concept"),
    build: Callable[[str], torch.nn.Module] | None = None,
    require_gpu: bool = False,
) -> tuple[list[StageResult], dict[str, Path]]:
    """Check each stage's detections against the concept golden (parity.tasks.check.run_check); write
    report.md/json, junit.xml, a plot and report.html. `build(stage)` replaces the model (tests plant defects
    through it)."""
    device = torch.device(device) if device else default_device()
    task = ConceptCheck(source, dataset, confidence_threshold, data_args, device, golden, build)
    return check.run_check(task, stages, report_dir=report_dir, require_gpu=require_gpu)
