"""Where a tracked frame's time goes, per kernel on the GPU and per part of the step on the host, at each object count.

    python -m bench.video_profile [--model sam2.1_hiera_l] [--stage bf16+compile+sdpa+triton] [--objects 1 8]
                                  [--frames 24] [--frames-per-encode 8] [--compile-mode reduce-overhead] [--clicks]
                                  [--input-size 1024] [--out reports/bench]

For every object count: bench.video's clip and prompts, one warm-up session (--warmup-frames), then one
session of --frames tracked frames under torch.profiler. The parts are the step's methods, each wrapped
in a record_function range for this run only: the image encoder (forward_image, a batch of
--frames-per-encode frames a call), the memory attention (_prepare_memory_conditioned_features), the SAM
heads (_forward_sam_heads), the memory encoder (_encode_new_memory) and the masks handed out
(_compact_output): the host time of each part's calls per tracked frame. Their GPU time is not
attributed to them: with CUDA graphs the profiler credited a part with more kernel time than the whole
session ran (H100, 8 objects: 22.0 ms of 18.1), so the GPU side is the kernel table, every kernel of the
session summed by name, and its total. The 8 / 1 column shows what grows with the objects (the video target's
target: 8 objects at most 2x one). Seeded weights.
--clicks profiles the frame-0 prompts instead (bench.video's "first frame ms": one add_new_points_or_box
call per object, after a warm-up session made the same calls), per click: the SAM heads' host time, the
masks made at the video's resolution (every object's on the frame, as sam2 returns them), and the kernels.
Writes video-profile.md under --out and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

import samfast
from bench.kernel_kinds import by_kind
from bench.timing import device_name, sync
from bench.video import WARMUP_FRAMES, click_objects, make_clip, open_session, propagate_each, samfast_predictor

# (part, owner attribute of the predictor ("" for the predictor itself), method)
PARTS = (
    ("image encoder", "model", "forward_image"),
    ("memory attention", "model", "_prepare_memory_conditioned_features"),
    ("SAM heads", "model", "_forward_sam_heads"),
    ("memory encoder", "model", "_encode_new_memory"),
    ("masks handed out", "", "_compact_output"),
)
CLICK_PARTS = (
    ("SAM heads", "model", "_forward_sam_heads"),
    ("masks at the video's resolution", "", "_frame_masks_at_video_res"),
)
KERNEL_ROWS = 30
ALL_KERNELS = "(all kernels)"


@contextlib.contextmanager
def part_ranges(predictor, parts):
    """Each part's method wrapped, on its instance, in a record_function range named after the part."""
    wrapped = []
    for part, owner_name, method in parts:
        owner = getattr(predictor, owner_name) if owner_name else predictor
        inner = getattr(owner, method)

        def ranged(*args, _inner=inner, _part=part, **kwargs):
            with torch.profiler.record_function(_part):
                return _inner(*args, **kwargs)

        setattr(owner, method, ranged)
        wrapped.append((owner, method))
    try:
        yield
    finally:
        for owner, method in wrapped:
            delattr(owner, method)


def profiled():
    """torch.profiler over the host and the GPU."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def tally(prof, parts, per: int) -> tuple[dict, dict]:
    """(host us of each part's ranges, GPU us of each kernel name), each over `per`."""
    from torch.autograd import DeviceType

    host, kernels = {}, {}
    names = {part for part, _, _ in parts}
    for event in prof.key_averages():
        on_gpu = event.device_type == DeviceType.CUDA
        if event.key in names and not on_gpu:  # the host range
            host[event.key] = event.cpu_time_total / per
        elif on_gpu and not event.is_user_annotation:  # a kernel, a copy or a memset
            kernels[event.key] = event.self_device_time_total / per
    kernels[ALL_KERNELS] = sum(kernels.values())
    return host, kernels


def profile_session(predictor, clip, objects: int, frames: int, device: torch.device):
    """(host us per tracked frame of each part, GPU us of each kernel name, wall ms per frame) over one session."""
    state, _, _ = open_session(predictor, clip, objects, device)
    with part_ranges(predictor, PARTS), profiled() as prof:
        [seconds] = propagate_each(predictor, [state], device, max_frames=frames)
    return *tally(prof, PARTS, len(seconds)), 1e3 * seconds[-1] / len(seconds)


def profile_clicks(predictor, clip, objects: int, device: torch.device):
    """(host us per click of each part, GPU us of each kernel name, wall ms per click) over the frame-0 clicks."""
    state = predictor.init_state(str(clip.folder))
    sync(device)
    with part_ranges(predictor, CLICK_PARTS), profiled() as prof:
        start = time.perf_counter()
        click_objects(predictor, state, clip, objects)
        sync(device)
        seconds = time.perf_counter() - start
    return *tally(prof, CLICK_PARTS, objects), 1e3 * seconds / objects


def ratio(values: dict, key: str, low: int, high: int) -> str:
    a, b = values[low].get(key, 0.0), values[high].get(key, 0.0)
    return f"{b / a:.2f}" if a > 0 else "-"


def table(title: str, values: dict[int, dict[str, float]], keys: list[str], counts: list[int], unit: str) -> list[str]:
    low, high = counts[0], counts[-1]
    lines = [f"## {title}", "", "| " + " | ".join(["what", *[f"{n} obj us/{unit}" for n in counts], f"{high} / {low}"]) + " |",
             "|---|" + "---:|" * (len(counts) + 1)]
    for key in keys:
        name = key if len(key) <= 90 else key[:87] + "..."
        lines.append(f"| {name.replace('|', '/')} | " + " | ".join(f"{values[n].get(key, 0.0):.0f}" for n in counts)
                     + f" | {ratio(values, key, low, high)} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.video_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="sam2.1_hiera_l", choices=samfast.SAM2_MODEL_TYPES)
    p.add_argument("--stage", default="bf16+compile+sdpa+triton")
    p.add_argument("--objects", nargs="+", type=int, default=[1, 8])
    p.add_argument("--frames", type=int, default=24, help="frames tracked after frame 0 in the profiled session")
    p.add_argument("--warmup-frames", type=int, default=WARMUP_FRAMES)
    p.add_argument("--frames-per-encode", type=int, default=8)
    p.add_argument("--compile-mode", default="reduce-overhead", help="SAMFAST_COMPILE_MODE for the build")
    p.add_argument("--clicks", action="store_true", help="profile the frame-0 clicks, not the tracked frames")
    p.add_argument("--input-size", type=int, default=None, help="the model's input size (default: its own, 1024); "
                   "256 for a CPU smoke test")
    p.add_argument("--out", default="reports/bench")
    args = p.parse_args(argv)
    os.environ["SAMFAST_COMPILE_MODE"] = args.compile_mode
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    counts = sorted(set(args.objects))
    unit = "click" if args.clicks else "frame"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    predictor = samfast_predictor(args.model, args.stage, device, args.input_size, args.frames_per_encode)
    host, kernels, wall = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-video-profile-") as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clip = make_clip(Path(folder), args.frames + 1, 480, 640, max(counts))
        for n in counts:
            warm, _, _ = open_session(predictor, clip, n, device)
            propagate_each(predictor, [warm], device, max_frames=args.warmup_frames)
            del warm
            sync(device)
            if args.clicks:
                host[n], kernels[n], wall[n] = profile_clicks(predictor, clip, n, device)
            else:
                host[n], kernels[n], wall[n] = profile_session(predictor, clip, n, args.frames, device)
            print(f"{n} object(s): {wall[n]:.2f} ms per {unit} under the profiler", file=sys.stderr, flush=True)
    longest = {name: us for name, us in kernels[counts[-1]].items() if name != ALL_KERNELS}
    kinds = {n: by_kind({name: us for name, us in kernels[n].items() if name != ALL_KERNELS}) for n in counts}
    top = sorted(longest, key=longest.get, reverse=True)[:KERNEL_ROWS]
    profiled_what = (f"the frame-0 clicks (one per object) after a warm-up session of {args.warmup_frames} tracked frames"
                     if args.clicks else
                     f"one session of {args.frames} tracked frames after a warm-up of {args.warmup_frames}")
    lines = [
        f"# video tracking: time per GPU kernel and per part of a {unit}",
        "",
        f"- device: {device_name(device)}; torch {torch.__version__}; {args.model}, stage {args.stage}, compile mode "
        f"{args.compile_mode}, frames per encode {args.frames_per_encode}; seeded synthetic weights",
        f"- command: `python -m bench.video_profile {' '.join(argv)}`",
        f"- profiled: {profiled_what}; wall ms per {unit} under the profiler: "
        + ", ".join(f"{n} obj {wall[n]:.2f}" for n in counts),
        "",
        *table(f"GPU kernels (all, then the {KERNEL_ROWS} longest at {counts[-1]} objects)", kernels, [ALL_KERNELS, *top],
               counts, unit),
        *table("GPU time by kind of kernel (bench.kernel_kinds)", kinds, list(kinds[counts[-1]]), counts, unit),
        *table(f"parts on the host (us per {unit} of each part's calls, their launches included)", host,
               [part for part, _, _ in (CLICK_PARTS if args.clicks else PARTS)], counts, unit),
    ]
    text = "\n".join(lines)
    (out / "video-profile.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
