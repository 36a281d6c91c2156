"""Segment everything on the GPU: ms per image for the reference generator, segment-anything-fast's and samfast's.

    python -m bench.amg [--models vit_b vit_h sam2.1_hiera_l] [--stages fp32 bf16 ...] [--out reports/bench]
                        [--repeats 3] [--points-per-side 32] [--quick] [--cpu]
    (or: nox -s bench -- --amg ...)

For every model: segment_anything's SamAutomaticMaskGenerator in fp32 as shipped (points_per_batch
64), segment-anything-fast's where it is installed (its own defaults), and samfast's at every
stage (points_per_batch None: as many points per decoder call as fit), each with the default
thresholds (0.88 / 0.95) and with pred_iou_thresh and stability_score_thresh at 0 (every mask
reaches RLE encoding and NMS). One process, seeded weights, the sam-demo dog.jpg (800x534) or a
generated image of that size without SAMFAST_DATA. One generate call to warm up, then the median
of --repeats; peak memory (torch.cuda.max_memory_allocated) beside each. Writes amg.md and
amg.json under --out and prints the table. A failing configuration is recorded and the run goes on.

A SAM 2 model (samfast.SAM2_MODEL_TYPES) runs beside sam2's SAM2AutomaticMaskGenerator in fp32 as
shipped (points_per_batch 64), built by sam2's build_sam2 with the same seeded state dict; "default"
thresholds are then sam2's (pred_iou 0.8 / stability 0.95); samfast.SamAutomaticMaskGenerator
serves the SAM 2 model with sam2's defaults. Default stages: those built for the family
(bench.families); segment-anything-fast has no SAM 2 and no row.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

import samfast
from bench.families import DEFAULT_THRESHOLDS, MODEL_TYPES, by_reference, built_stages, not_built, reference_model, reference_name
from bench.timing import (command_line, counting_compiles, device_name, fmt, peak_gib, reset_peak, run_configurations, sync,
                          timed_compile_note)
from samfast.families import family_of
from samfast.stages import LADDER, canonical_name, compile_mode, parse_stages

# fp32 .. nt, those built for the model's family; int8 and sparse trade accuracy (add them with --stages)
LOSSLESS_STAGES = list(LADDER[:6])
THRESHOLD_SETTINGS = ("default", "zero")  # default: the family's generator defaults (DEFAULT_THRESHOLDS)
IMAGE_SIZE = (534, 800)  # sam-demo dog.jpg
# by reference package: its generator (module, class), and a faster fork of it benchmarked as shipped
REFERENCE_GENERATORS = {"segment_anything": ("segment_anything", "SamAutomaticMaskGenerator"),
                        "sam2": ("sam2.automatic_mask_generator", "SAM2AutomaticMaskGenerator")}
FORKS = {"segment_anything": "segment-anything-fast"}


@dataclass
class Row:
    model: str
    impl: str  # "reference", "segment-anything-fast" or "samfast"
    stage: str
    thresholds: str
    ms_per_image: float | None = None
    masks: int | None = None
    peak_gib: float | None = None
    error: str | None = None
    skipped: str | None = None  # planned so: a stage not built for the model's family
    notes: dict = field(default_factory=dict)


def thresholds(model_type: str, setting: str) -> tuple[float, float]:
    """(pred_iou_thresh, stability_score_thresh) of a THRESHOLD_SETTINGS name for the model's family."""
    return by_reference(DEFAULT_THRESHOLDS, model_type) if setting == "default" else (0.0, 0.0)


def load_image() -> tuple[np.ndarray, str]:
    from parity.golden.settings import DataNotFoundError, data_root

    try:
        path = data_root() / "sam-demo" / "dog.jpg"
        from PIL import Image

        return np.array(Image.open(path).convert("RGB")), str(path)
    except (DataNotFoundError, FileNotFoundError):
        rng = np.random.default_rng(0)
        return rng.integers(0, 256, (*IMAGE_SIZE, 3), dtype=np.uint8), f"generated {IMAGE_SIZE[1]}x{IMAGE_SIZE[0]} noise"


def build(model_type: str, impl: str, stage: str, device: torch.device):
    """settings -> generator, with the model built once (a compiled stage compiles once for both
    threshold settings); None where segment-anything-fast is not installed."""
    if impl == "reference":
        module, name = by_reference(REFERENCE_GENERATORS, model_type)
        Generator = getattr(importlib.import_module(module), name)
        sam = reference_model(model_type, device)
        return lambda settings: Generator(sam, points_per_batch=64, **settings)
    if impl == "segment-anything-fast":
        try:
            from segment_anything_fast import (
                SamAutomaticMaskGenerator,
                sam_model_registry,
            )
        except ImportError:
            return None
        sam = sam_model_registry[model_type]()
        sam.load_state_dict(samfast.synthetic_state_dict(model_type, seed=0))
        sam = sam.to(device).eval()
        return lambda settings: SamAutomaticMaskGenerator(sam, **settings)
    model = samfast.build_sam(model_type, device=device, stages=stage, batch_size=1)
    return lambda settings: samfast.SamAutomaticMaskGenerator(model, points_per_batch=None, **settings)


def time_generate(generator, image: np.ndarray, device: torch.device, repeats: int,
                  notes: dict | None = None) -> tuple[float, int, float | None]:
    """(median ms per image, masks out, peak GiB) after one warm-up call; graphs compiled after it counted
    into `notes` (a row's, for its note)."""
    notes = {} if notes is None else notes
    records = generator.generate(image)
    sync(device)
    reset_peak(device)
    runs = []
    with counting_compiles(notes):
        for _ in range(repeats):
            sync(device)
            start = time.perf_counter()
            records = generator.generate(image)  # returns host records: the call ends synchronized
            sync(device)
            runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs), len(records), peak_gib(device)


def plan(args) -> list[Row]:
    """Rows grouped by (model, implementation, stage), the two threshold settings inside each group."""
    rows = []
    for model in args.models:
        stages = args.stages if args.stages is not None else built_stages(model, LOSSLESS_STAGES)
        rows += [Row(model, "reference", "fp32", t) for t in args.reference_thresholds]
        if fork := FORKS.get(reference_name(model)):
            rows += [Row(model, fork, "as shipped", t) for t in THRESHOLD_SETTINGS]
        rows += [Row(model, "samfast", stage, t, skipped=not_built(model, stage)) for stage in stages for t in THRESHOLD_SETTINGS]
    return rows


@torch.no_grad()
def run_group(rows: list[Row], args, image: np.ndarray, device: torch.device) -> None:
    """Time every row of one (model, implementation, stage); a failure is recorded on the rows left."""
    first = rows[0]
    if first.skipped:
        return
    try:
        make_generator = build(first.model, first.impl, first.stage, device)
        for row in rows:
            if make_generator is None:
                row.error = "not installed (pip install segment-anything-fast)"
                continue
            pred_iou, stability = thresholds(row.model, row.thresholds)
            generator = make_generator(dict(points_per_side=args.points_per_side, pred_iou_thresh=pred_iou,
                                            stability_score_thresh=stability))
            row.ms_per_image, row.masks, row.peak_gib = time_generate(generator, image, device, args.repeats, row.notes)
    except Exception as err:  # noqa: BLE001 - record and go on: one configuration must not end the run
        for row in rows:
            if row.ms_per_image is None:
                row.error = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
                row.notes["traceback"] = traceback.format_exc(limit=-3)


def markdown(env: dict, rows: list[Row]) -> str:
    families = sorted({family_of(r.model) for r in rows}, key=lambda f: f.name)
    defaults = "; ".join(f"{f.name} ({f.reference}'s generator) pred_iou {DEFAULT_THRESHOLDS[f.reference][0]} / "
                         f"stability {DEFAULT_THRESHOLDS[f.reference][1]}" for f in families)
    references = ", ".join(f"{reference_name(m)} for {m}" for m in dict.fromkeys(r.model for r in rows))
    lines = [
        "# segment everything (automatic mask generation) benchmark",
        "",
        f"- device: {env['device']}; torch {env['torch']}",
        f"- command: `{env['command']}`",
        f"- image: {env['image']}; points_per_side {env['points_per_side']}; seeded synthetic weights, the same state dict "
        + "in every implementation (masks meaningless)",
        f"- reference: {references}, fp32 as shipped, points_per_batch 64",
        f"- timing: one warm-up generate, median of {env['repeats']}; compile mode {env['compile_mode']}; peak GiB: torch.cuda.max_memory_allocated over the timed calls",
        f"- thresholds: default = the generator's defaults: {defaults}; zero = both 0 (every mask reaches RLE and NMS)",
        "",
        "| model | thresholds | implementation | stage | ms per image | vs reference | masks | peak GiB | note |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    ref = {(r.model, r.thresholds): r.ms_per_image for r in rows if r.impl == "reference"}
    for r in rows:
        base = ref.get((r.model, r.thresholds))
        speedup = f"{base / r.ms_per_image:.1f}x" if r.ms_per_image and base else "-"
        lines.append(
            f"| {r.model} | {r.thresholds} | {r.impl} | {r.stage} | {fmt(r.ms_per_image, 1)} | {speedup} | "
            f"{'-' if r.masks is None else r.masks} | {fmt(r.peak_gib)} | "
            f"{(r.error or r.skipped or timed_compile_note(r.notes)).replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, env: dict, rows: list[Row]) -> str:
    table = markdown(env, rows)
    (out / "amg.md").write_text(table)
    (out / "amg.json").write_text(json.dumps({"environment": env, "results": [asdict(r) for r in rows]}, indent=2, default=str))
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.amg", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["vit_b", "vit_h"], choices=MODEL_TYPES,
                   help="SAM 1 and SAM 2 model types (SAM 2: beside sam2's generator)")
    p.add_argument("--stages", nargs="+", default=None,
                   help="samfast stages (default: fp32 .. nt, those built for the model's family; "
                        "a stage asked for that the family has no build of is recorded as not built)")
    p.add_argument("--reference-thresholds", nargs="*", default=list(THRESHOLD_SETTINGS), choices=list(THRESHOLD_SETTINGS),
                   help="threshold settings to time the reference at (its 'zero' takes ~50 s per image on an H100: "
                        "ANCHORS.md has those numbers; pass 'default' to skip it)")
    p.add_argument("--compile-mode", help="sets SAMFAST_COMPILE_MODE (default: max-autotune on the GPU)")
    p.add_argument("--points-per-side", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="reports/bench")
    p.add_argument("--quick", action="store_true", help="points_per_side 2 and one repetition: a smoke test")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    args = p.parse_args(argv)
    if args.quick:
        args.points_per_side, args.repeats = 2, 1
    if args.stages is not None:  # canonical names, as bench.ladder's (and a bad name fails now)
        args.stages = list(dict.fromkeys(canonical_name(parse_stages(s)) for s in args.stages))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    if args.compile_mode:
        os.environ["SAMFAST_COMPILE_MODE"] = args.compile_mode
    image, source = load_image()
    env = {
        "device": device_name(device),
        "torch": torch.__version__,
        "command": command_line("bench.amg", sys.argv[1:] if argv is None else argv),
        "image": source,
        "compile_mode": compile_mode(device),
        "points_per_side": args.points_per_side,
        "repeats": args.repeats,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = plan(args)
    run_configurations(
        rows, device, lambda group: run_group(group, args, image, device),
        lambda row: f"{row.model} {row.thresholds} {row.impl} {row.stage}: {fmt(row.ms_per_image, 1)} ms "
                    f"{row.error or row.skipped or ''}",
        lambda: write_outputs(out, env, rows))
    print(write_outputs(out, env, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
