"""SAM 3 images: sam3 0.1.4 as it ships against samfast's stages, in one process, the same seeded weights.

    python -m bench.sam3 --out reports/sam3                     (every built samfast stage, every sam3 mode)
    python -m bench.sam3 --stages fp32 bf16+compile --sam3 fp32 bf16 --images 8 --phrases 4
    python -m bench.sam3 --model sam3_reduced --device cpu --sam3 --warmup 0 --repeats 1   (samfast alone, a small model)

Three workloads. The phrase workloads are timed as one call from pixels to the processor's outputs (masks
at the image's size, boxes, scores above the confidence threshold):
- "1 x 1": set_image then set_text_prompt on one image and one phrase;
- "N x P": every one of P phrases on every one of N images. sam3 loops (set_image per image, then
  reset_all_prompts and set_text_prompt per phrase), as its users do; samfast answers all pairs with one
  Sam3Processor.predict_batch call (its phrase cache off, so every call encodes them, as sam3's loop does).
- "1 point": predict_inst with one positive click at the image's centre, three masks, on an image set
  before the timing starts: the prompt is what a user repeats per click (both models are built with
  enable_inst_interactivity=True).

sam3's modes: fp32 (with the TF32 that importing sam3 switches on, as it ships; samfast's rows run under
it too), bf16 (its model under torch.autocast bf16, as its examples run it), compile
(build_sam3_image_model(compile=True), under bf16 autocast). Weights: samfast.synthetic_state_dict("sam3", 0),
loaded into both with strict=True: seeded, not trained, so the detections are meaningless and only the time
and memory are compared; both keep the same instances, since they compute the same model. sam3's builder makes
the full-size model only: --model names a smaller samfast model type for samfast's rows alone (--sam3 with no
modes). Writes sam3.md (the table), sam3.json and sam3.png.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

import samfast
from bench.ladder import environment
from bench.timing import clock_name, command_line, counting_compiles, fmt, free, peak_gib, reset_peak, time_call, timed_compile_note
from samfast.build import built_switches
from samfast.sam3 import Sam3Processor
from samfast.sam3.checkpoint import model_layout
from samfast.sam3.config import MODEL_TYPES, sam3_config
from samfast.sam3.tokenizer import bpe_vocab_path
from samfast.stages import canonical_name

SAM3_MODES = ("fp32", "bf16", "compile")
MODEL_TYPE = "sam3"
SEED = 0
PHRASES = ("a red circle", "the dog", "blue squares", "a person riding a bike", "cars", "the triangle",
           "trees", "a cup")


@dataclass
class Row:
    impl: str  # "sam3" or "samfast"
    stage: str  # sam3's mode or samfast's stage name
    workload: str  # "1 x 1" or "N x P"
    ms: float | None = None
    peak_gib: float | None = None
    instances: int | None = None  # instances kept over the workload's pairs: equal between the two
    notes: dict = field(default_factory=dict)


def images(count: int, seed: int = SEED) -> list[np.ndarray]:
    """(H, W, 3) uint8 noise images, 1024 x 768: what matters here is their size, not their content."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (768, 1024, 3), dtype=np.uint8) for _ in range(count)]


def sam3_model(model_type: str, mode: str, checkpoint: dict, device: torch.device):
    """sam3's Sam3Image as its builder makes it (compile=True for the compile mode, with the point and box
    predictor), samfast's seeded weights in sam3.pt's layout loaded strictly."""
    if model_type != MODEL_TYPE:
        raise SystemExit(f"bench.sam3: sam3's builder makes the full-size model only, not {model_type}: "
                         f"run --model {MODEL_TYPE}, or pass --sam3 with no modes to time samfast's rows alone")
    builder = importlib.import_module("sam3.model_builder")
    model = builder.build_sam3_image_model(bpe_path=str(bpe_vocab_path()), device=str(device), checkpoint_path=None,
                                           load_from_HF=False, enable_inst_interactivity=True,
                                           compile=mode == "compile")
    model.load_state_dict(model_layout(checkpoint, model.state_dict()), strict=True)
    return model.eval()


def sam3_processor(model, model_type: str, device: torch.device, threshold: float):
    from sam3.model.sam3_image_processor import Sam3Processor as Sam3Reference

    return Sam3Reference(model, resolution=sam3_config(model_type).image_size, device=str(device),
                         confidence_threshold=threshold)


def one_pair(processor, batch: list[np.ndarray], phrases: list[str]) -> int:
    """set_image then set_text_prompt: one image, one phrase."""
    state = processor.set_image(batch[0])
    return len(processor.set_text_prompt(phrases[0], state)["scores"])


def looped(processor, batch: list[np.ndarray], phrases: list[str]) -> int:
    """sam3's way to put P phrases to N images: one image at a time, one phrase at a time."""
    kept = 0
    for image in batch:
        state = processor.set_image(image)
        for phrase in phrases:
            processor.reset_all_prompts(state)
            kept += len(processor.set_text_prompt(phrase, state)["scores"])
    return kept


def batched(processor: Sam3Processor, batch: list[np.ndarray], phrases: list[str]) -> int:
    return sum(len(pair["scores"]) for per_image in processor.predict_batch(batch, phrases) for pair in per_image)


def point_prompt(processor, state: dict) -> int:
    """predict_inst with one positive click at the centre of the image set in `state`: the masks it gives."""
    centre = np.array([[state["original_width"] / 2, state["original_height"] / 2]])
    masks, _, _ = processor.model.predict_inst(state, point_coords=centre, point_labels=np.array([1]),
                                               multimask_output=True)
    return len(masks)


POINT = "1 point"


def workloads(args) -> dict[str, tuple[list[np.ndarray], list[str]]]:
    return {"1 x 1": (images(1), [PHRASES[0]]),
            f"{args.images} x {args.phrases}": (images(args.images), list(PHRASES[: args.phrases])),
            POINT: (images(1), [])}


def prepared_call(workload: str, processor, many, batch: list[np.ndarray], phrases: list[str]) -> Callable[[], int]:
    """The call a workload times, giving the instances (or masks) it keeps: "1 x 1" through one_pair, the
    point prompt on an image set here, untimed, the other through `many` (looped or batched)."""
    if workload == POINT:
        state = processor.set_image(batch[0])
        return lambda: point_prompt(processor, state)
    if workload == "1 x 1":
        return lambda: one_pair(processor, batch, phrases)
    return lambda: many(processor, batch, phrases)


def time_rows(impl: str, stage: str, processor, many, args, device: torch.device) -> list[Row]:
    """Every workload's row on one processor."""
    return [time_row(impl, stage, workload, processor, many, batch, phrases, args, device)
            for workload, (batch, phrases) in workloads(args).items()]


def time_row(impl: str, stage: str, workload: str, processor, many, batch, phrases, args, device: torch.device) -> Row:
    """One workload's row (prepared_call says what is timed); peak memory over preparing and timing it."""
    row = Row(impl, stage, workload)
    reset_peak(device)
    try:
        with torch.inference_mode():
            call = prepared_call(workload, processor, many, batch, phrases)
            row.instances = call()
            with counting_compiles(row.notes):
                row.ms = 1e3 * time_call(call, device, warmup=args.warmup, iters=args.iters, repeats=args.repeats)
    except torch.cuda.OutOfMemoryError as error:
        row.notes["error"] = f"out of memory: {error}".splitlines()[0]
    row.peak_gib = peak_gib(device)
    print(f"{impl} {stage} {workload}: {fmt(row.ms)} ms, peak {fmt(row.peak_gib)} GiB, {row.instances} kept",
          file=sys.stderr, flush=True)
    return row


def run(args, device: torch.device) -> list[Row]:
    checkpoint = samfast.synthetic_state_dict(args.model, SEED)  # sam3.pt's layout, as build_sam reads it
    rows = []
    for mode in args.sam3:
        model = sam3_model(args.model, mode, checkpoint, device)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if mode != "fp32" else contextlib.nullcontext()
        with autocast:
            rows += time_rows("sam3", mode, sam3_processor(model, args.model, device, args.threshold), looped, args,
                              device)
        del model
        free(device)
    for stage in args.stages:
        for workload, (batch, phrases) in workloads(args).items():
            # with the compile switch the ViT runs batches of exactly batch_size images: one per workload,
            # as a user builds it for the batches they run (a 1 x 1 call padded to 8 images times 8 ViTs)
            model = samfast.build_sam(args.model, checkpoint, device=device, stages=stage, batch_size=len(batch),
                                      enable_inst_interactivity=True)
            # no phrase cache: every call encodes its phrases, as sam3's loop does
            processor = Sam3Processor(model, resolution=sam3_config(args.model).image_size,
                                      confidence_threshold=args.threshold, text_cache_size=0)
            rows.append(time_row("samfast", canonical_name(model.switches), workload, processor, batched, batch,
                                 phrases, args, device))
            del model, processor
            free(device)
    return rows


def markdown(env: dict, rows: list[Row]) -> str:
    lines = [f"# SAM 3 images ({env['model']}): sam3 {env.get('sam3')} as shipped vs samfast", "",
             f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}, Triton {env['triton']}; {env['timing']}.",
             f"Command: `{env['command']}`; confidence threshold {env['threshold']}", "",
             f"Weights: {env['weights']}", "",
             "| implementation | stage | workload | ms per call | peak GiB | instances kept | note |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        note = r.notes.get("error") or timed_compile_note(r.notes)
        lines.append(f"| {r.impl} | {r.stage} | {r.workload} | {fmt(r.ms)} | {fmt(r.peak_gib)} | {r.instances} | {note} |")
    by = {(r.impl, r.stage, r.workload): r.ms for r in rows}
    lines += ["", "Speed-ups (sam3's ms / samfast's ms, same workload):", ""]
    if not any(r.impl == "sam3" for r in rows):
        return "\n".join([*lines, "- none: no sam3 row (--sam3 named no mode)"]) + "\n"
    for r in rows:
        if r.impl != "samfast" or r.ms is None:
            continue
        against = [f"{mode} {by[('sam3', mode, r.workload)] / r.ms:.2f}x" for mode in SAM3_MODES
                   if by.get(("sam3", mode, r.workload))]
        lines.append(f"- samfast {r.stage}, {r.workload}: " + (", ".join(against) or "no sam3 row"))
    return "\n".join(lines) + "\n"


def plot(path: Path, rows: list[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads_seen = list(dict.fromkeys(r.workload for r in rows))
    fig, axes = plt.subplots(1, len(workloads_seen), figsize=(6 * len(workloads_seen), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads_seen):
        mine = [r for r in rows if r.workload == workload and r.ms is not None]
        ax.barh([f"{r.impl} {r.stage}" for r in mine], [r.ms for r in mine],
                color=["tab:gray" if r.impl == "sam3" else "tab:blue" for r in mine])
        ax.set_xlabel("ms per call (lower is better)")
        ax.set_title(f"{workload} (image x phrase)")
        ax.invert_yaxis()
    fig.suptitle("SAM 3 images, seeded weights: sam3 as shipped (gray) vs samfast (blue)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# int8 and fp8 replace the same ViT linears: one at a time
QUANTIZERS = frozenset({"int8", "fp8"})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sam3", description=__doc__.split("\n")[0])
    lossless = "+".join(["fp32", *sorted(built_switches(MODEL_TYPE) - QUANTIZERS)])
    quantized = [f"{lossless}+{q}" for q in sorted(built_switches(MODEL_TYPE) & QUANTIZERS)
                 if q != "fp8" or torch.cuda.is_available()]
    parser.add_argument("--model", default=MODEL_TYPE, choices=MODEL_TYPES,
                        help="samfast's model type (sam3's rows need the full-size sam3)")
    parser.add_argument("--stages", nargs="+", default=["fp32", lossless, *quantized],
                        help="samfast stages (default: fp32, every lossless switch SAM 3 builds, and that with each "
                             "quantizer it builds: int8, and fp8 on a GPU)")
    parser.add_argument("--sam3", nargs="*", default=list(SAM3_MODES), choices=SAM3_MODES, help="sam3's modes")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--phrases", type=int, default=4, choices=range(1, len(PHRASES) + 1))
    parser.add_argument("--threshold", type=float, default=0.5, help="the processors' confidence threshold: with "
                        "seeded weights it sets how many instances each pair keeps and upsamples (0 keeps all 200)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("reports/sam3"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = torch.device(args.device)
    # importing sam3 turns TF32 on where the GPU has it, for every row after: the environment records the
    # flags all rows run under
    importlib.import_module("sam3.model_builder")
    timing = f"{args.warmup} warm-up calls, median of {args.repeats} runs x {args.iters} calls, {clock_name(device)}"
    env = environment(device, command_line("bench.sam3", argv), timing)
    env["model"] = args.model
    env["weights"] = (f"seeded synthetic (samfast.synthetic_state_dict('{args.model}', {SEED})), sam3.pt's layout; "
                      "sam3 loads the same tensors with strict=True")
    env["sam3"] = importlib.metadata.version("sam3")
    env["threshold"] = args.threshold
    rows = run(args, device)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sam3.json").write_text(json.dumps({"environment": env, "rows": [asdict(r) for r in rows]}, indent=1))
    (args.out / "sam3.md").write_text(markdown(env, rows))
    plot(args.out / "sam3.png", rows)
    print((args.out / "sam3.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
