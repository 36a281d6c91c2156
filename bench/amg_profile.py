"""Where a segment-everything call spends its time, per step and per kernel, with and without the decoder and resize changes.

    python -m bench.amg_profile [--models vit_b vit_h] [--stage nt] [--variants before all] [--out reports/bench]

For every model and variant: one samfast generate on sam-demo dog.jpg (points_per_side 32, default
thresholds, seeded weights), one warm-up then the median of --repeats, and the time of each step
of the generator (CUDA-synchronised timers around _embed, _decode, the per-crop filters and the
records); for the last variant a torch.profiler table of the CUDA kernels. The variants undo, in
this process only, what the AMG speed work changed to SAM 1 (docs/amg.md), so one run shows what each change is
worth (a SAM 2 model runs as built, variant "all" only):

- before: PIL resize on the host, cuDNN's transposed convolutions in the decoder;
- resize: + the image resized on the device (samfast.resize);
- gemm: + the decoder's upscaling as GEMMs (MaskDecoder.upscale_impl "gemm", commit 355f977);
- upscale: + the upscaling and mask product as one Triton kernel where the stage has the triton
  switch (upscale_impl "triton", kernels.upscaled_masks, commit 40073d9);
- all: + the cross attentions folded into per-prompt matrices, likewise under the triton switch
  (TwoWayTransformer.fused_cross_attention, kernels.decoder_attention): what build_sam gives now.

Writes amg-profile.md under --out and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import samfast
import samfast.predictor as predictor_module
from bench.amg import load_image, time_generate
from bench.families import MODEL_TYPES, reference_name
from bench.timing import device_name, sync
from samfast.amg.generator import SamAutomaticMaskGenerator

VARIANTS = ("before", "resize", "gemm", "upscale", "all")
# the references whose family's modules the variants before "all" undo (SAM 1's mask decoder); another runs "all"
VARIANT_REFERENCES = frozenset({"segment_anything"})
STEPS = ("_embed", "_decode", "_filter_crop", "_records")


@contextlib.contextmanager
def variant(model, name: str):
    """The model and modules as they were before the changes that `name` leaves out."""
    level = VARIANTS.index(name)
    if level == len(VARIANTS) - 1:  # nothing left out: any family's model as built (SAM 2 has only this one)
        yield
        return
    transformer = model.mask_decoder.transformer
    saved = (predictor_module.same_as_pil, model.mask_decoder.upscale_impl, transformer.fused_cross_attention)
    if level < 1:
        predictor_module.same_as_pil = lambda *_: False
    if level < 3 and saved[1] != "conv":
        model.mask_decoder.upscale_impl = "conv" if level < 2 else "gemm"
    if level < 4:
        transformer.fused_cross_attention = False
    try:
        yield
    finally:
        predictor_module.same_as_pil, model.mask_decoder.upscale_impl, transformer.fused_cross_attention = saved


@contextlib.contextmanager
def step_timers(generator: SamAutomaticMaskGenerator, device: torch.device, totals: dict[str, float]):
    """Wrap the generator's steps with synchronised timers adding up ms into `totals`."""
    for step in STEPS:
        inner = getattr(generator, step)

        def timed(*args, _inner=inner, _step=step, **kwargs):
            sync(device)
            start = time.perf_counter()
            out = _inner(*args, **kwargs)
            sync(device)
            totals[_step] = totals.get(_step, 0.0) + (time.perf_counter() - start) * 1e3
            return out

        setattr(generator, step, timed)
    try:
        yield
    finally:
        for step in STEPS:
            delattr(generator, step)


def kernel_table(generator, image: np.ndarray, rows: int = 25) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generator.generate(image)
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.amg_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["vit_b", "vit_h"], choices=MODEL_TYPES)
    p.add_argument("--stage", default="nt")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--compile-mode", default="default", help="SAMFAST_COMPILE_MODE for the build")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="reports/bench")
    args = p.parse_args(argv)
    os.environ["SAMFAST_COMPILE_MODE"] = args.compile_mode
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    image, source = load_image()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# segment everything: time per step",
        "",
        f"- device: {device_name(device)}; torch {torch.__version__}; stage {args.stage}; compile mode {args.compile_mode}",
        f"- command: `python -m bench.amg_profile {' '.join(sys.argv[1:] if argv is None else argv)}`",
        f"- image: {source}; points_per_side 32; default thresholds; seeded synthetic weights; median of {args.repeats}",
        "",
        "| model | variant | ms per image | masks | " + " | ".join(f"{s} ms" for s in STEPS) + " |",
        "|---|---|---:|---:|" + "---:|" * len(STEPS),
    ]
    tables = []
    for model_type in args.models:
        model = samfast.build_sam(model_type, device=device, stages=args.stage, batch_size=1)
        generator = SamAutomaticMaskGenerator(model, points_per_batch=None)  # sam2's generator for a SAM 2 model
        variants = args.variants if reference_name(model_type) in VARIANT_REFERENCES else ["all"]
        for name in variants:
            with variant(model, name):
                ms, masks, _ = time_generate(generator, image, device, args.repeats)
                totals: dict[str, float] = {}
                with step_timers(generator, device, totals):
                    generator.generate(image)
                if name == variants[-1] and device.type == "cuda":
                    tables.append(f"## {model_type} {name}: CUDA kernels over one generate\n\n```\n{kernel_table(generator, image)}\n```\n")
            lines.append(f"| {model_type} | {name} | {ms:.1f} | {masks} | " + " | ".join(f"{totals.get(s, 0):.1f}" for s in STEPS) + " |")
            print(lines[-1], file=sys.stderr, flush=True)
            text = "\n".join(lines) + "\n\n" + "\n".join(tables)
            (out / "amg-profile.md").write_text(text)  # after every variant: a killed run keeps what it has
        del model, generator
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
