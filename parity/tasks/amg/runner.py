"""The gate's two jobs for segment-everything: make an AMG golden, check stages against it.

Mirrors parity.tasks.point.runner (the point-prompt task) and shares its ModelSource; the CLI reaches these
with `--task amg`. Images go through the generator one at a time, so models are built for batch 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from parity.checks.exercised import watch_switches
from parity.compare.gates import StageResult, load_thresholds, thresholds_for
from parity.golden import manifest as golden_io
from parity.golden.data import Dataset
from parity.golden.rle import decode_rle
from parity.report.verdicts import remove_reports
from parity.tasks.amg import golden as amg_golden
from parity.tasks.amg.compare import compare
from parity.tasks.amg.generate import IGNORED_SWITCHES, AmgParams, Generated, generate, make_generator
from parity.tasks.amg.pictures import amg_comparison_png
from parity.tasks.amg.report import write_reports
from parity.tasks.source import ModelSource, default_device, release_gpu_cache
from samfast.stages import canonical_name, parse_stages

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


def worst_pictures(result: StageResult, dataset: Dataset, golden: dict[int, list[dict]],
                   stage: dict[int, list[dict]]) -> dict[int, bytes]:
    """image id -> PNG of the golden's and the stage's masks on the image, for each of the stage's worst images."""
    pictures = {}
    for w in result.worst:
        image_id = w["image_id"]
        image = dataset.samples[dataset.samples.image_ids.index(image_id)].image  # read only the worst images
        title = (f"image {image_id}: union IoU {w['union_iou_mean']:.3f}, {w['golden_masks']} golden / "
                 f"{w['stage_masks']} stage masks, {w['lost']} lost, {w['new']} new")
        pictures[image_id] = amg_comparison_png(
            image, [decode_rle(r["segmentation"]) for r in golden[image_id]],
            [decode_rle(r["segmentation"]) for r in stage[image_id]], [(g, s) for g, s, _ in w["pairs"]], title)
    return pictures


def make_golden(source: ModelSource, dataset: Dataset, params: AmgParams, *, device=None,
                points_per_batch: int = POINTS_PER_BATCH, root: Path | None = None) -> Path:
    device = torch.device(device) if device else default_device()
    settings = golden_io.fp32_settings()
    sha = source.sha256()
    generated = _run(_build(source, "fp32", device), params, points_per_batch, dataset,
                     f"AMG golden {source.model_type} fp32")
    amg_golden.refuse_useless(generated.images, "lower --pred-iou-thresh / --stability-score-thresh")
    manifest = golden_io.base_manifest(source.model_type, source.label, sha, dataset, "point", device)
    manifest.update(fp32_settings=settings, masks_meaningful=source.masks_meaningful, amg_params=params.as_dict(),
                    points_per_batch=points_per_batch)
    return amg_golden.publish(golden_folder(source, sha, dataset, root), generated, manifest)


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
    """Check each stage's generated masks against the AMG golden; write report.md/json, junit.xml and a plot.
    A stage whose switch did not run (parity.checks.exercised) is "not exercised", or failed with `require_gpu`."""
    remove_reports(Path(report_dir))  # first of all: a check that stops on bad input leaves no earlier PASS behind
    device = torch.device(device) if device else default_device()
    golden_io.no_tf32()  # the stages' own switches set the precision; fp32 is compared as the golden ran it
    sha = source.sha256()
    folder = Path(golden) if golden else golden_folder(source, sha, dataset)
    regenerate = regenerate_command(source, data_args, params)
    manifest, golden_images = amg_golden.read(folder, regenerate)
    expected = {"model_type": source.model_type, "checkpoint_sha256": sha,
                "dataset_fingerprint": dataset.fingerprint, "prompt_policy": amg_golden.GRID_POLICY}
    golden_io.verify_matches(manifest, expected, folder, regenerate)
    amg_golden.verify_params(manifest, params, folder, regenerate)
    thresholds = load_thresholds(table="amg")
    results = []
    for stage in stages:
        release_gpu_cache()
        switches = parse_stages(stage)
        name = canonical_name(switches)
        limits = thresholds_for(stage, thresholds)
        try:
            with watch_switches(switches, IGNORED_SWITCHES) as used:
                model = used.watch(_build(source, stage, device, build))
                # the masks NMS dropped at a near tie, which rounding may have swapped with the golden's
                generated = _run(model, params, points_per_batch, dataset, f"AMG check {name}",
                                 alternates_within=limits["max_score_abs_err"])
        except Exception as err:  # a stage that cannot run here is a failed stage, reported with its reason
            results.append(StageResult(name, [], {}, error=f"{type(err).__name__}: {err}"))
            continue
        result = compare(name, generated.images, golden_images, limits, params, generated.alternates)
        if result.summary:
            result.summary.update(seconds=generated.seconds, ms_per_image=generated.ms_per_image,
                                  kernel_fallbacks=used.kernel_fallbacks)
        used.record(result, require_gpu)
        if result.failures or result.near_failing:
            result.pictures = worst_pictures(result, dataset, golden_images, generated.images)
        results.append(result)
    header = {
        "model_type": source.model_type,
        "checkpoint": source.label,
        "dataset": f"{dataset.name} ({len(dataset.samples)} images)",
        "amg_params": params.as_dict(),
        "points_per_batch": points_per_batch,
        "golden_masks": manifest.get("masks"),
        **golden_io.provenance(folder, manifest, device),
    }
    return results, write_reports(Path(report_dir), header, results)
