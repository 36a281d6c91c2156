"""The two jobs of the gate as Python calls: make a golden, and check stages against it.

The CLI (python -m parity) is a thin layer over these; tests call them directly, e.g. with a
`build` that perturbs weights to prove the check fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

import samfast
from parity.checks.exercised import watch_switches
from parity.compare.gates import StageResult, load_thresholds, thresholds_for
from parity.golden import manifest as golden_io
from parity.golden.data import Dataset
from parity.golden.distributed import SINGLE_PROCESS, RankFailure, Ranks, WorkFolder, failure, raise_first_failure
from parity.golden.rle import decode_rle
from parity.report.pictures import mask_comparison_png
from parity.report.verdicts import remove_reports
from parity.tasks.point import golden as point_golden
from parity.tasks.point.compare import compare
from parity.tasks.point.evaluate import StageOutputs, evaluate
from parity.tasks.point.report import write_reports
from parity.tasks.source import ModelSource, default_device, release_gpu_cache
from samfast.stages import canonical_name, parse_stages


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
    settings = golden_io.fp32_settings()
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


def worst_pictures(result: StageResult, dataset: Dataset, prompt: str) -> dict[int, bytes]:
    """ann_id -> PNG of the golden and the stage's mask on the image, for each of the stage's worst annotations."""
    pictures = {}
    for w in result.worst:
        sample = dataset.samples[dataset.samples.image_ids.index(w["image_id"])]
        ann = next(a for a in sample.annotations if a.ann_id == w["ann_id"])
        golden_rle, stage_rle = result.worst_masks[w["ann_id"]]
        title = (f"annotation {w['ann_id']} (image {w['image_id']}): IoU vs golden "
                 f"{w['iou_vs_golden']:.3f}, mask {w['best']} / golden {w['golden_best']}"
                 + (" (near tie)" if w["near_tie"] else ""))
        pictures[w["ann_id"]] = mask_comparison_png(
            sample.image, decode_rle(golden_rle), decode_rle(stage_rle), title=title,
            point=ann.point if prompt == "point" else None, box=ann.box if prompt == "box" else None)
    return pictures


def regenerate_command(source: ModelSource, data_args: str, prompt: str) -> str:
    return f"python -m parity golden {source.cli_args()} {data_args}" + (f" --prompt {prompt}" if prompt != "point" else "")


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
    """Check each stage against the golden; write report.md/json/html, junit.xml and a plot (rank 0; the
    other ranks return None). Each stage's finished batches wait in report_dir/.<stage>.work/ until
    the reports are written, so a re-run after a kill resumes; a custom `build` is not resumable
    (nothing identifies it). A stage whose switch did not run (parity.checks.exercised) is "not exercised",
    or failed with `require_gpu`."""
    if ranks.is_main:  # first of all: a check that stops on bad input or crashes leaves no earlier PASS behind
        remove_reports(Path(report_dir))
    device = torch.device(device) if device else default_device()
    golden_io.no_tf32()  # the stages' own switches set the precision; fp32 is compared as the golden ran it
    sha = source.sha256()
    folder = Path(golden) if golden else golden_folder(source, sha, dataset, prompt)
    regenerate = regenerate_command(source, data_args, prompt)
    manifest, golden_outputs = point_golden.read_golden(folder, regenerate)
    expected = {
        "model_type": source.model_type,
        "checkpoint_sha256": sha,
        "dataset_fingerprint": dataset.fingerprint,
        "prompt_policy": dataset.manifest()["prompt_policy" if prompt == "point" else "box_policy"],
    }
    golden_io.verify_matches(manifest, expected, folder, regenerate)
    thresholds = load_thresholds()
    resumable = build is None
    build = build or (lambda stages: source.build(stages, device, batch_size))
    results, works = [], []
    for stage in stages:
        release_gpu_cache()
        switches = parse_stages(stage)
        name = canonical_name(switches)
        work = None
        if resumable:
            work = WorkFolder(Path(report_dir) / f".{name}.work",
                              run_identity("check", source, sha, dataset, prompt, batch_size, name, device), ranks)
            works.append(work)
        try:
            with watch_switches(switches) as used:  # the point task reads every switch
                outputs = evaluate(used.watch(_build_on_every_rank(build, stage, ranks)), dataset, prompt=prompt,
                                   batch_size=batch_size, desc=f"check {name}", ranks=ranks, work=work)
        except RankFailure as err:  # a stage that cannot run here is a failed stage, reported with its reason
            if err.bad_input or not err.agreed:  # bad data, or this rank lost its peers: no later stage can run
                raise
            results.append(StageResult(name, [], {}, error=str(err)))
            continue
        if not ranks.is_main:
            continue
        result = compare(name, outputs, golden_outputs, thresholds_for(stage, thresholds), source.masks_meaningful)
        # Visible, not silent: calls the fused kernel could not serve and sent to the slow path.
        result.summary["kernel_fallbacks"] = used.kernel_fallbacks
        used.record(result, require_gpu)
        if result.failures or result.near_failing:
            result.pictures = worst_pictures(result, dataset, prompt)
        result.worst_masks = {}  # the pictures are made: nothing else needs the masks
        results.append(result)
    header = {
        "model_type": source.model_type,
        "checkpoint": source.label,
        "dataset": f"{dataset.name} ({len(dataset.samples)} images)",
        "annotations": dataset.num_annotations,
        "prompt": prompt,
        **golden_io.provenance(folder, manifest, device),
        "masks_meaningful": source.masks_meaningful,
    }
    if not ranks.is_main:
        return None
    paths = write_reports(Path(report_dir), header, results)
    for work in works:
        work.remove()
    return results, paths


def _build_on_every_rank(build: Callable[[str], torch.nn.Module], stage: str, ranks: Ranks) -> torch.nn.Module:
    """The stage's model; when any rank cannot build it, every rank raises RankFailure alike."""
    model = problem = None
    try:
        model = build(stage)
    except Exception as err:
        problem = failure(ranks, f"building the model: {type(err).__name__}: {err}", bad_input=False)
    raise_first_failure(ranks.all_gather(problem))
    return model
