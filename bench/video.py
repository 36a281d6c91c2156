"""Video tracking: frames per second of samfast's VideoPredictor beside sam2's SAM2VideoPredictor.

    python -m bench.video [--models sam2.1_hiera_t sam2.1_hiera_l] [--objects 1 8] [--videos 1] [--frames 48]
                          [--stages fp32 fp32+sdpa bf16+sdpa] [--reference fp32 bf16] [--vos-optimized]
                          [--input-size 1024] [--warmup-frames 17] [--out reports/bench] [--cpu]

The video bench of docs/sam2.md. For every model, implementation and object count, in one process:

  fps              frames propagate_in_video yields per second over the whole clip, frame 0 (prompted)
                   included: per-frame image encoding, memory attention, decoding and memory encoding,
                   as sam2 runs them; not init_state, not the prompt calls; the masks stay on the device
  first frame ms   the add_new_points_or_box calls on frame 0, one per object, together (the time to
                   the first masks of every object)
  compile s        the warm-up session's seconds (init_state, prompts, 8 frames) less the first timed
                   session's for the same work: torch.compile's compiling where a row compiles
                   (sam2's vos_optimized), otherwise first-call warm-up (cuDNN, allocator), near 0
  peak GiB         torch.cuda.max_memory_allocated over the timed sessions (reset after the warm-up)
  x 1 object       the row's seconds per frame over its own seconds per frame with the fewest objects

Rows: samfast's build_sam_video per stage (a stage video tracking is not built for is reported with
build_sam_video's refusal); sam2 1.1.0's build_sam2_video_predictor with the same seeded state dict,
loaded strictly: "fp32" as shipped, "bf16" under torch.autocast(cuda, bfloat16) as sam2's README runs
it, and with --vos-optimized "bf16 vos_optimized" (SAM2VideoPredictorVOS: every component compiled
by sam2, max-autotune; minutes of compiling per model). bf16 rows run on CUDA only.

--videos N: N inference states of the same clip, opened together (all held in memory). samfast tracks
them in one propagate_in_videos call (the objects of every video on a frame in one batched step);
sam2 takes one state a call, so its states are propagated one after another. fps: frames of any
video per second.
The clip: parity.golden.videos' generated clip at --height x --width, written as a JPEG folder, the
input both predictors' init_state read. Before timing, one warm-up session per row and object count
tracks --warmup-frames frames (17: the memory bank full), so compiling, cuDNN's and the allocator's first calls are not timed.
Writes video.md and video.json under --out and prints the table last; a failing configuration is
recorded and the run goes on. Seeded synthetic weights: the speed and memory of real checkpoints.
A CPU smoke test (tests/unit/test_bench_video.py): python -m bench.video --cpu --models sam2.1_hiera_nano
--objects 1 2 --frames 3 --warmup-frames 1 --input-size 256
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import samfast
from bench.families import SEED
from bench.timing import (command_line, counting_compiles, device_name, fmt, peak_gib, reset_peak, run_configurations, sync,
                          timed_compile_note)
from samfast.errors import StageError
from samfast.stages import canonical_name, compile_mode, parse_stages

SAMFAST, SAM2 = "samfast", "sam2"
VOS = "bf16 vos_optimized"
# sam2 row name -> (bf16 autocast, vos_optimized), slowest first
SAM2_ROWS = {"fp32": (False, False), "bf16": (True, False), VOS: (True, True)}
# Tracked frames of a warm-up session (--warmup-frames): by frame 8 a model's memory bank holds all its
# num_maskmem (7) memories, by frame 16 its 16 object pointers (max_obj_ptrs_in_encoder), so sam2's memory
# attention has met every memory length a video gives it (eager in vos_optimized: cuDNN builds a plan per
# new length). A warm-up of 8 frames was too short: vos_optimized's timed session slowed between
# frames 8 and 18 (H100, docs/measurements/video/memory-attention-by-frame-h100-2026-11-26.md): first calls timed.
WARMUP_FRAMES = 17
CLIP_SEED, CLIP_ID = 0, 1
JPEG_QUALITY = 95


@dataclass
class Row:
    model: str
    impl: str  # SAMFAST or SAM2
    stage: str  # samfast: a stage; sam2: a SAM2_ROWS name
    objects: int
    videos: int
    fps: float | None = None  # per video
    first_frame_ms: float | None = None  # mean over the videos
    compile_s: float | None = None
    peak_gib: float | None = None
    build_s: float | None = None
    error: str | None = None
    skipped: str | None = None  # planned so: a stage refused, a bf16 row on a CPU
    notes: dict = field(default_factory=dict)


class NotRun(Exception):
    """A configuration this device cannot run: recorded as skipped, with the reason."""


# --- the clip ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchClip:
    folder: Path  # 00000.jpg, 00001.jpg, ...: sam2's init_state reads a JPEG folder (or an .mp4) only
    clicks: list[tuple[float, float]]  # (x, y) on frame 0, one per object, in object id order
    size: tuple[int, int]  # (height, width)
    frames: int
    generated_objects: int

    def describe(self, objects: int) -> str:
        """What `objects` objects are prompted with, for the report."""
        own = min(objects, self.generated_objects)
        text = f"objects 1-{own}: the clip's generated objects, one click at each one's centre point on frame 0"
        if objects > own:
            text += (f"; objects {own + 1}-{objects}: one click each at points of a grid over frame 0 "
                     "(background or object: a click is tracked the same)")
        return text


def grid_points(count: int, height: int, width: int) -> list[tuple[float, float]]:
    """`count` distinct (x, y) pixel centres of the smallest n x n grid with that many cells, row by row."""
    n = max(1, math.ceil(math.sqrt(count)))
    cells = [(int((i + 0.5) * width / n), int((j + 0.5) * height / n)) for j in range(n) for i in range(n)]
    return [(float(x), float(y)) for x, y in cells[:count]]


def make_clip(folder: Path, frames: int, height: int, width: int, max_objects: int) -> BenchClip:
    """The generated clip as a JPEG folder, and a click per object: the generator draws a fixed few
    objects (parity.golden.videos.ROLES), so objects beyond those are clicked at grid points."""
    from parity.golden.data import centre_point
    from parity.golden.videos import generate_clip

    clip = generate_clip(CLIP_ID, seed=CLIP_SEED, frames=frames, height=height, width=width)
    for t, frame in enumerate(clip.frames):
        Image.fromarray(frame).save(folder / f"{t:05d}.jpg", quality=JPEG_QUALITY)
    visible = [obj for obj in range(len(clip.masks)) if clip.visible(obj, 0)]
    clicks = [centre_point(clip.masks[obj, 0]) for obj in visible][:max_objects]
    clicks += grid_points(max_objects - len(clicks), height, width)
    return BenchClip(folder, [(float(x), float(y)) for x, y in clicks], (height, width), frames, len(visible))


# --- the predictors ------------------------------------------------------------------------------
def samfast_predictor(model_type: str, stage: str, device: torch.device, input_size: int | None, frames_per_encode: int):
    """build_sam_video at the stage (its StageError says why a stage is not built for video)."""
    from parity.tasks.video.produce import at_input_size

    predictor = samfast.build_sam_video(model_type, seed=SEED, device=device, stages=stage,
                                        frames_per_encode=frames_per_encode)
    if input_size is not None:
        at_input_size(predictor.model, input_size)
    return predictor


def sam2_predictor(model_type: str, row: str, device: torch.device, input_size: int | None):
    """sam2's build_sam2_video_predictor as shipped (apply_postprocessing), with samfast's seeded state
    dict loaded strictly; the config and hydra overrides of the model type as the tests build it."""
    from sam2.build_sam import build_sam2_video_predictor

    from parity.reference import sam2_reference_config

    bf16, vos_optimized = SAM2_ROWS[row]
    if bf16 and device.type != "cuda":
        raise NotRun("sam2's bf16 path is torch.autocast on CUDA: GPU only")
    config, overrides = sam2_reference_config(model_type)
    if input_size is not None:
        overrides.append(f"++model.image_size={input_size}")
    predictor = build_sam2_video_predictor(config, None, device=device, hydra_overrides_extra=overrides,
                                           vos_optimized=vos_optimized)
    if vos_optimized:
        # sam2's compiled memory attention (max-autotune, dynamic=True) fails on its second call under torch
        # >= 2.6 with "accessing tensor output of CUDAGraphs that has been overwritten" (sam2 issue #501,
        # open; an H200 run of this bench with torch 2.11 too): its users' workaround, in that issue, leaves
        # that one component eager; every other one stays compiled as sam2 compiles it.
        del predictor.memory_attention.forward  # the instance's compiled forward; the class's eager one remains
    predictor.load_state_dict(samfast.synthetic_state_dict(model_type, seed=SEED), strict=True)
    return predictor.eval()


def precision(row: Row):
    """sam2's bf16 rows run every call under autocast, as sam2's README does; samfast's stages carry their dtype."""
    if row.impl == SAM2 and SAM2_ROWS[row.stage][0]:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# --- one session ---------------------------------------------------------------------------------
def open_session(predictor, clip: BenchClip, objects: int, device: torch.device):
    """(state, init_state seconds, seconds of the frame-0 prompt calls of all objects)."""
    sync(device)
    start = time.perf_counter()
    state = predictor.init_state(str(clip.folder))
    sync(device)
    opened = time.perf_counter()
    click_objects(predictor, state, clip, objects)
    sync(device)
    return state, opened - start, time.perf_counter() - opened


def click_objects(predictor, state, clip: BenchClip, objects: int) -> None:
    """The frame-0 prompts: one click at each of the first `objects` clicks of the clip, object ids from 1."""
    for obj_id, (x, y) in enumerate(clip.clicks[:objects], start=1):
        predictor.add_new_points_or_box(state, 0, obj_id, points=np.array([[x, y]], dtype=np.float32),
                                        labels=np.array([1], dtype=np.int32))


class FrameClock:
    """Seconds from a start to each frame, without a sync between frames (a sync would change what is
    timed): CUDA events on the device's timeline on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        sync(device)
        self.points = [self._now()]

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def tick(self) -> None:
        self.points.append(self._now())

    def seconds(self, device: torch.device) -> list[float]:
        """Seconds from the start to each tick, after a sync."""
        sync(device)
        start = self.points[0]
        if self.cuda:
            return [start.elapsed_time(end) / 1e3 for end in self.points[1:]]
        return [end - start for end in self.points[1:]]


def seconds_to_each(frames: Iterator, device: torch.device) -> list[float]:
    """Seconds from the start to each item the iterator `frames` yields; the masks are left on the device."""
    clock = FrameClock(device)
    for _ in frames:
        clock.tick()
    return clock.seconds(device)


def propagate_each(predictor, states: list, device: torch.device, max_frames: int | None = None) -> list[list[float]]:
    """One forward propagation from frame 0 per state, one after another: per state, the seconds to each frame."""
    return [seconds_to_each(predictor.propagate_in_video(state, start_frame_idx=0, max_frame_num_to_track=max_frames),
                            device) for state in states]


def propagate_together(predictor, states: list, device: torch.device, max_frames: int | None = None) -> list[list[float]]:
    """samfast's propagate_in_videos over every state from frame 0: one run, the seconds to each (video, frame)."""
    return [seconds_to_each(predictor.propagate_in_videos(states, start_frame_idx=0, max_frame_num_to_track=max_frames),
                            device)]


def measure(row: Row, predictor, clip: BenchClip, device: torch.device, warmup_frames: int) -> None:
    """A warm-up of the same calls over --warmup-frames frames, then row.videos timed sessions: fps,
    first-frame ms, compile s, peak GiB."""
    together = row.impl == SAMFAST and row.videos > 1
    propagate = propagate_together if together else propagate_each
    warm_count = row.videos if together else 1
    warm_sessions = [open_session(predictor, clip, row.objects, device) for _ in range(warm_count)]
    [warm] = propagate(predictor, [state for state, _, _ in warm_sessions], device, max_frames=warmup_frames)
    warm_opening = sum(init + prompt for _, init, prompt in warm_sessions)
    del warm_sessions
    sync(device)
    reset_peak(device)
    with counting_compiles(row.notes):
        sessions = [open_session(predictor, clip, row.objects, device) for _ in range(row.videos)]
        runs = propagate(predictor, [state for state, _, _ in sessions], device)
    row.peak_gib = peak_gib(device)
    row.fps = sum(len(run) for run in runs) / sum(run[-1] for run in runs)
    row.first_frame_ms = 1e3 * sum(prompt for _, _, prompt in sessions) / len(sessions)
    # the warm-up's work done again by the timed sessions: as many sessions opened, as many frames tracked
    opening = sum(init + prompt for _, init, prompt in sessions[:warm_count])
    row.compile_s = (warm_opening + warm[-1]) - (opening + runs[0][len(warm) - 1])
    row.notes["videos_together"] = together
    row.notes["per_run_fps"] = [len(run) / run[-1] for run in runs]
    row.notes["init_state_s"] = sessions[0][1]


def run_group(rows: list[Row], clip: BenchClip, device: torch.device, args) -> None:
    """Every object count of one (model, implementation, stage), the predictor built once (outside inference
    mode: its parameters stay ordinary tensors, as torch.compile expects; the predictors' calls enter it themselves)."""
    first = rows[0]
    try:
        start = time.perf_counter()
        if first.impl == SAMFAST:
            predictor = samfast_predictor(first.model, first.stage, device, args.input_size, args.frames_per_encode)
        else:
            predictor = sam2_predictor(first.model, first.stage, device, args.input_size)
        build_s = time.perf_counter() - start
        for row in rows:
            row.build_s = build_s
            with precision(row), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # both warn on every frame without sam2's hole-filling CUDA extension
                measure(row, predictor, clip, device, args.warmup_frames)
    except (StageError, NotRun) as why:
        for row in rows:
            row.skipped = ("refused: " if isinstance(why, StageError) else "") + " ".join(str(why).split())
    except Exception as err:  # noqa: BLE001 - record and go on: one configuration must not end the run
        for row in rows:
            if row.fps is None:
                row.error = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
                row.notes["traceback"] = traceback.format_exc(limit=-3)


# --- the run -------------------------------------------------------------------------------------
def plan(args) -> list[Row]:
    """Per model: sam2's rows first, then samfast's stages; each with every object count."""
    rows = []
    for model in args.models:
        configs = [(SAM2, name) for name in args.reference] + [(SAMFAST, stage) for stage in args.stages]
        rows += [Row(model, impl, stage, objects, args.videos) for impl, stage in configs for objects in args.objects]
    return rows


def commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True, text=True,
                             check=True, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment(device: torch.device, args, clip: BenchClip, argv: list[str]) -> dict:
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "sam2": importlib.metadata.version("sam2"),
        "commit": commit(),
        "command": command_line("bench.video", argv),
        "weights": f"seeded synthetic weights (samfast.synthetic_state_dict, seed {SEED}); sam2 loads the same state dict",
        "clip": f"parity.golden.videos clip {CLIP_ID} (seed {CLIP_SEED}), {clip.frames} frames of {clip.size[1]}x{clip.size[0]}, "
                f"a JPEG folder (quality {JPEG_QUALITY}) read by both init_state",
        "input_size": args.input_size or "the model's (1024)",
        "prompts": {n: clip.describe(n) for n in args.objects},
        "frames_per_encode": args.frames_per_encode,
        "compile_mode": compile_mode(device),
        "timing": f"one warm-up session per row and object count (init_state, prompts, {args.warmup_frames} tracked frames), "
                  "then init_state and the prompts timed by time.perf_counter between synchronizations, propagate_in_video "
                  + ("by CUDA events at every frame, one synchronize at its end" if device.type == "cuda" else "by time.perf_counter"),
    }


FPS_NOTE = ("fps: frames of any video yielded per second (several videos: samfast's in one propagate_in_videos call, "
            "sam2's one after another), per-frame "
            "image encoding included, init_state and prompts not, masks left on the device")
COLUMNS_NOTE = ("- first frame ms: the frame-0 add_new_points_or_box calls of all objects; compile s: the warm-up "
                "session's extra seconds over the first timed session's same work (compiling where a row compiles, else "
                "near 0); peak GiB: "
                "torch.cuda.max_memory_allocated over the timed sessions; x 1 object: seconds per frame over the same "
                "row's with the fewest objects")
SAM2_NOTE = ("- sam2 rows: build_sam2_video_predictor as shipped; bf16 = torch.autocast(cuda, bfloat16) around every "
             "call; bf16 vos_optimized = SAM2VideoPredictorVOS (sam2 compiles every component but the memory "
             "attention, left eager as sam2 issue #501's workaround: compiled, it fails under torch >= 2.6)")


def markdown(env: dict, rows: list[Row]) -> str:
    lines = [
        "# video tracking benchmark",
        "",
        f"- device: {env['device']}; torch {env['torch']}; reference sam2 {env['sam2']}; commit {env['commit']}",
        f"- command: `{env['command']}`",
        f"- weights: {env['weights']}: speed and memory as real checkpoints, masks meaningless",
        f"- clip: {env['clip']}; model input size {env['input_size']}",
        *[f"- {n} object(s) prompted: {text}" for n, text in env["prompts"].items()],
        f"- samfast rows: the image encoder takes {env['frames_per_encode']} frame(s) about to be tracked per call "
        f"(--frames-per-encode); sam2's takes one; the compile switch's mode {env['compile_mode']}",
        f"- timing: {env['timing']}; {FPS_NOTE}",
        COLUMNS_NOTE,
        SAM2_NOTE,
        "",
        "| model | objects | implementation | stage | fps | vs sam2 | x 1 object | first frame ms | compile s | peak GiB | note |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        note = (r.error or r.skipped or timed_compile_note(r.notes)).replace("|", "/")
        lines.append(f"| {r.model} | {r.objects} | {r.impl} | {r.stage} | {fmt(r.fps)} | {versus_sam2(r, rows)} | "
                     f"{per_object_ratio(r, rows)} | {fmt(r.first_frame_ms, 1)} | {fmt(r.compile_s, 1)} | "
                     f"{fmt(r.peak_gib)} | {note} |")
    return "\n".join(lines) + "\n"


def versus_sam2(row: Row, rows: list[Row]) -> str:
    """The row's fps over sam2's best measured row of the same model and object count (vos_optimized,
    else bf16, else fp32), naming it."""
    if row.impl != SAMFAST or not row.fps:
        return "-"
    measured = {r.stage: r.fps for r in rows if r.impl == SAM2 and r.model == row.model and r.objects == row.objects and r.fps}
    best = next((name for name in reversed(SAM2_ROWS) if name in measured), None)
    return "-" if best is None else f"{row.fps / measured[best]:.2f}x {best}"


def per_object_ratio(row: Row, rows: list[Row]) -> str:
    """Seconds per frame over those of the same model, implementation and stage at the fewest objects."""
    same = [r for r in rows if (r.model, r.impl, r.stage) == (row.model, row.impl, row.stage) and r.fps]
    if not row.fps or not same:
        return "-"
    fewest = min(same, key=lambda r: r.objects)
    return f"{fewest.fps / row.fps:.2f}"


def write_outputs(out: Path, env: dict, rows: list[Row]) -> str:
    table = markdown(env, rows)
    (out / "video.md").write_text(table)
    (out / "video.json").write_text(json.dumps({"environment": env, "results": [asdict(r) for r in rows]}, indent=2, default=str))
    return table


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.video", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["sam2.1_hiera_t", "sam2.1_hiera_l"], choices=samfast.SAM2_MODEL_TYPES)
    p.add_argument("--objects", nargs="+", type=int, default=[1, 8], help="object counts, each tracked in its own sessions")
    p.add_argument("--videos", type=int, default=1, help="inference states per row, opened together; samfast tracks them in one "
                   "propagate_in_videos call, sam2 one after another")
    p.add_argument("--frames", type=int, default=48)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--stages", nargs="*", default=["fp32", "fp32+sdpa", "bf16+sdpa"],
                   help="samfast stages (default: fp32 fp32+sdpa bf16+sdpa; none with an empty list); one that "
                        "build_sam_video does not build for video tracking is reported as refused")
    p.add_argument("--reference", nargs="*", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                   help="sam2 rows (bf16: under torch.autocast on CUDA; none with an empty list)")
    p.add_argument("--vos-optimized", action="store_true",
                   help="add sam2's bf16 vos_optimized row (CUDA only; compiles for minutes per model)")
    p.add_argument("--frames-per-encode", type=int, default=1,
                   help="samfast's rows: frames the image encoder takes ahead of tracking per call (default 1, as sam2)")
    p.add_argument("--input-size", type=int, default=None,
                   help="the models' input size (default: their own, 1024); 256 for a CPU smoke test")
    p.add_argument("--warmup-frames", type=int, default=WARMUP_FRAMES,
                   help=f"frames the warm-up session tracks after frame 0 (default {WARMUP_FRAMES})")
    p.add_argument("--compile-mode", help="sets SAMFAST_COMPILE_MODE for samfast's compiled rows (default: max-autotune "
                   "on the GPU, CUDA graphs included; sam2's vos_optimized row compiles as sam2 ships it, max-autotune)")
    p.add_argument("--out", default="reports/bench")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    args = p.parse_args(argv)
    if min(args.objects) < 1 or args.videos < 1 or args.frames_per_encode < 1 or not 1 <= args.warmup_frames < args.frames:
        p.error("--objects, --videos and --frames-per-encode take positive counts, --warmup-frames at least 1 and "
                "fewer than --frames")
    args.objects = sorted(set(args.objects))
    # one row per switch set, so "sdpa+fp32" and "fp32+sdpa" are one row (and a bad name fails now); the
    # row keeps the spelling given first: the ladder's short name for bf16+compile+sdpa is "sdpa", which
    # a reader of the table would take for fp32+sdpa
    given = {}
    for stage in args.stages:
        given.setdefault(canonical_name(parse_stages(stage)), stage)
    args.stages = list(given.values())
    args.reference = list(dict.fromkeys(args.reference)) + ([VOS] if args.vos_optimized else [])
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.compile_mode:
        os.environ["SAMFAST_COMPILE_MODE"] = args.compile_mode
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = plan(args)
    with tempfile.TemporaryDirectory(prefix="bench-video-") as folder:
        clip = make_clip(Path(folder), args.frames, args.height, args.width, max(args.objects))
        env = environment(device, args, clip, argv)
        run_configurations(
            rows, device, lambda group: run_group(group, clip, device, args),
            lambda row: f"{row.model} {row.impl} {row.stage} {row.objects} obj: {fmt(row.fps)} fps "
                        f"{row.error or row.skipped or ''}",
            lambda: write_outputs(out, env, rows))
    print(write_outputs(out, env, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
