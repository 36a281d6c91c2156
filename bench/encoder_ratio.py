"""samfast's image encoder against the reference's in one process, timed in alternating blocks: the ratio
of their speeds with its spread, for a target stated as a ratio (docs/sam2.md: hiera_l at batch 8, >= 1.5x
sam2's compiled bf16 encoder).

The ladder times each configuration once, one after the other. The same ladder command gave hiera_l's
ratio as 1.515x and 1.480x on two H200s within the hour (docs/history/sam2-encoder-speed.md): a GPU's
speed moves, between
machines and over minutes on one, and a row timed later sees another GPU than the row before it. Here
both encoders are built and warmed first, then timed in pairs in the order samfast, reference,
reference, samfast: a drift of the machine's speed that is linear over a pair cancels out of that pair's
ratio (`alternating_ratios`). The result is the median of the pair ratios, with their least and greatest.

    python -m bench.encoder_ratio --model sam2.1_hiera_l --batch 8 --stage bf16+compile+sdpa+triton+nt \
        --reference bf16 --pairs 12 --compile-mode default --out reports/ratio   (the defaults but the mode)

Writes ratio.md (the table), ratio.json and ratio.png (each pair's ratio, the median and the target).
Peak memory is the ladder's to measure: here both models are resident at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from bench.families import MODEL_TYPES, by_reference
from bench.ladder import REFERENCE, REFERENCE_STAGES, NotRun, Row, environment, make_inputs, make_runner
from bench.timing import clock_name, command_line, sync, time_call
from samfast.stages import canonical_name, parse_stages


def alternating_ratios(time_a: Callable[[], float], time_b: Callable[[], float], pairs: int) -> list[tuple[float, float, float]]:
    """Per pair (a's seconds, b's seconds, b's / a's: how many times faster a is), each pair timed as
    a, b, b, a. The two a blocks sit at positions 0 and 3, the b blocks at 1 and 2: equal sums, so a
    speed that drifts linearly over the pair weighs on both alike."""
    out = []
    for _ in range(pairs):
        a1, b1, b2, a2 = time_a(), time_b(), time_b(), time_a()
        a, b = (a1 + a2) / 2, (b1 + b2) / 2
        out.append((a, b, b / a))
    return out


def build(model: str, stage: str, reference: str, batch: int, device: torch.device, reference_compile_mode):
    """(samfast's encode, reference's encode), each a no-argument call on its own seeded batch, both
    called once (the compile, when the stage compiles). The reference first: a run this device cannot
    make (NotRun) is known before samfast's compile."""
    runners = {}
    for row in (Row(model, batch, by_reference(REFERENCE_STAGES, model)[reference], REFERENCE), Row(model, batch, stage, "samfast")):
        runner = make_runner(row, device, reference_compile_mode)
        images, _ = make_inputs(batch, runner.dtype, device)
        t0 = time.perf_counter()
        runner.encode(images)
        sync(device)
        print(f"{row.stage}: built, first call {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        runners[row.impl] = (lambda runner=runner, images=images: runner.encode(images))
    return runners["samfast"], runners[REFERENCE]


def verdict(ratios: list[float], target: float) -> str:
    if min(ratios) >= target:
        return "met by every pair"
    return "met by the median" if statistics.median(ratios) >= target else "NOT met"


def markdown(env: dict, args, pairs: list[tuple[float, float, float]]) -> str:
    ratios = [r for _, _, r in pairs]
    median = statistics.median(ratios)
    lines = [
        "# samfast encoder against the reference, alternating blocks", "",
        f"- device: {env['device']}; torch {env['torch']}, triton {env['triton']}, sam2 {env['sam2']}, "
        f"segment_anything {env['segment_anything']}",
        f"- command: `{env['command']}`",
        f"- weights: {env['weights']}",
        f"- timing: {env['timing']}; compile mode {env['compile_mode']}",
        "",
        f"**{args.model}, batch {args.batch}: {args.stage} is {median:.3f}x reference {args.reference}** "
        f"(median of {len(ratios)} pairs; least {min(ratios):.3f}x, greatest {max(ratios):.3f}x)"
        + ("" if args.target is None else f"; target {args.target:g}x: {verdict(ratios, args.target)}"),
        "",
        "| pair | samfast ms/call | reference ms/call | samfast img/s | reference img/s | ratio |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (a, b, r) in enumerate(pairs, 1):
        lines.append(f"| {i} | {a * 1e3:.2f} | {b * 1e3:.2f} | {args.batch / a:.2f} | {args.batch / b:.2f} | {r:.3f} |")
    return "\n".join(lines) + "\n"


def plot(path: Path, args, ratios: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(range(1, len(ratios) + 1), ratios, "o", label="pair")
    ax.axhline(statistics.median(ratios), color="C0", lw=1, label="median")
    if args.target is not None:
        ax.axhline(args.target, color="C3", ls="--", lw=1, label=f"target {args.target:g}x")
    ax.set_xticks(range(1, len(ratios) + 1))
    ax.set_xlabel("pair (samfast, reference, reference, samfast)")
    ax.set_ylabel("samfast / reference speed")
    ax.set_title(f"{args.model} batch {args.batch}: {args.stage} vs reference {args.reference}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.encoder_ratio", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sam2.1_hiera_l", choices=MODEL_TYPES)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--stage", default="bf16+compile+sdpa+triton+nt", help="samfast's stage (ladder name or switches joined by '+')")
    p.add_argument("--reference", default="bf16", choices=["fp32", "bf16"],
                   help="the reference's run, as in bench.ladder (bf16: sam2's compiled bf16 encoder, GPU only)")
    p.add_argument("--reference-compile-mode", default=None, help="as in bench.ladder (default: --compile-mode's)")
    p.add_argument("--compile-mode", default=None, help="sets SAMFAST_COMPILE_MODE (default: max-autotune on the GPU)")
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3, help="calls of each before the first pair")
    p.add_argument("--iters", type=int, default=10, help="calls in one timed block")
    p.add_argument("--target", type=float, default=None, help="a ratio to state as met or not (e.g. 1.5)")
    p.add_argument("--out", default="reports/ratio")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    args = p.parse_args(argv)
    if min(args.pairs, args.iters) < 1 or args.warmup < 0:
        p.error("--pairs and --iters need at least 1, --warmup at least 0")
    args.stage = canonical_name(parse_stages(args.stage))  # a bad name fails now, not after a build
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    if args.compile_mode:
        os.environ["SAMFAST_COMPILE_MODE"] = args.compile_mode
    timing = (f"{args.warmup} warm-up calls each, then {args.pairs} pairs of blocks of {args.iters} calls "
              f"(samfast, reference, reference, samfast), {clock_name(device)}")
    env = environment(device, command_line("bench.encoder_ratio", argv), timing)
    with torch.no_grad():
        try:
            samfast_call, reference_call = build(args.model, args.stage, args.reference, args.batch, device,
                                                 args.reference_compile_mode)
        except NotRun as why:
            print(f"error: reference {args.reference} of {args.model}: {why}; on this device pass --reference fp32",
                  file=sys.stderr)
            return 2
        for call in (samfast_call, reference_call):
            for _ in range(args.warmup):
                call()
        block = dict(warmup=0, iters=args.iters, repeats=1)
        pairs = alternating_ratios(lambda: time_call(samfast_call, device, **block),
                                   lambda: time_call(reference_call, device, **block), args.pairs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(env, args, pairs)
    (out / "ratio.md").write_text(table)
    (out / "ratio.json").write_text(json.dumps({"environment": env, "args": vars(args), "pairs": [
        {"samfast_s": a, "reference_s": b, "ratio": r} for a, b, r in pairs]}, indent=2, default=str))
    plot(out / "ratio.png", args, [r for _, _, r in pairs])
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
