"""Teach the small SAM 2 to track: train its video modules on generated clips.

    python -m tinysam.train_tracking [--init samfast/weights/sam2.1_hiera_nano_trained.pt] [--minutes 5]
                                     [--out samfast/weights] [--smoke]

The image run (`python -m tinysam.train --model sam2.1_hiera_nano`) trains the image path only; the
memory attention, the memory encoder and the object pointers keep their seeded init, and tracking
from them loses every object after the prompted frame. This run starts from that checkpoint and
trains those modules and the object-score head, which only the tracker reads (tinysam.rollout: every
image result stays bit for bit), on windows of generated clips (tinysam.clips), each object clicked
on a window's first frame and tracked through the rest, at input size 256, the video gate's (a CPU
tracks ~10x faster there than at 1024). The loop is the image run's (tinysam.loop.run_schedule).

Validation tracks held-out clips (seed tinysam.clips.HELDOUT_SEED) through samfast's video predictor
as the gate does (parity.tasks.video.produce: one centre click per object on its first visible frame,
one forward propagation) and reports J&F against the ground truth (J region IoU, F the DAVIS
boundary F, parity.compare), over every object and frame, and J over the tracked frames alone.
Like the image run, the whole run fits --minutes: after a short calibration the step count is fixed
from the measured speed; `--steps N` replays a run.

Outputs in --out, each written under a temporary name and renamed: the checkpoint (the image run's
file name, replaced: the same image-path tensors, trained video modules), its manifest (the image
run's, with a "tracking" section: this command, its replay, the validation before and after),
sam2.1_hiera_nano_tracking_log.csv and sam2.1_hiera_nano_tracking_curve.png.
"""

from __future__ import annotations

import time

_START = time.monotonic()  # the --minutes budget counts from here, before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from parity.compare.boundary import boundary_f  # noqa: E402
from parity.compare.metrics import mask_iou  # noqa: E402
from parity.golden.manifest import no_tf32  # noqa: E402
from parity.golden.videos import generate_clip  # noqa: E402
from parity.tasks.video.produce import at_input_size, prompts, track_clip  # noqa: E402
from samfast import build_sam_video  # noqa: E402
from samfast.checkpoint import TRAINED_CHECKPOINTS  # noqa: E402
from tinysam.clips import (  # noqa: E402
    CLIP_FRAMES,
    HELDOUT_SEED,
    WINDOW,
    WindowSampler,
    build_clip_pool,
)
from tinysam.configs import SAM2_NANO  # noqa: E402
from tinysam.loop import Run, run_schedule, train_in_tf32, training_autocast  # noqa: E402
from tinysam.optimizer import make_optimizer  # noqa: E402
from tinysam.outputs import plot_curve, save_checkpoint, write_json, write_log_csv  # noqa: E402
from tinysam.rollout import (  # noqa: E402
    VIDEO_MODULES,
    prepare_for_tracking,
    set_tracking_mode,
    track_windows,
    tracking_loss,
)
from tinysam.train import _cpu_count, add_run_flags  # noqa: E402

FAMILY = SAM2_NANO
LOG_NAME, CURVE_NAME = "sam2.1_hiera_nano_tracking_log.csv", "sam2.1_hiera_nano_tracking_curve.png"
LOG_FIELDS = ("step", "seconds", "lr", "loss", "mask", "object", "steps_per_s", "val_jf", "val_j_tracked")
DEFAULTS = dict(pool=800, windows=16, lr=5e-4, weight_decay=0.1, warmup=100, size=256, log_every=25, val_every=90.0,
                val_clips=8, workers=max(1, _cpu_count() - 1))
# Steps between which the speed is measured. Later than the image run's: on an H200 steps 10-30 ran at
# 1.2 steps/s and the rest at 1.8-2.0 (why was not measured: the steps run eagerly, on object counts
# that change every step), so a plan made on them ended the run at 314 s of a 510 s budget.
CALIBRATE_STEPS = (40, 80)
SMOKE = dict(pool=4, windows=2, steps=3, warmup=1, log_every=1, val_every=0.0, val_clips=1, workers=1, device="cpu")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tinysam.train_tracking", description=__doc__.split("\n\n")[0])
    p.add_argument("--init", type=Path, default=TRAINED_CHECKPOINTS[FAMILY.model_type],
                   help="the image run's checkpoint, its manifest (.json) beside it (default: the packaged one, whose video "
                        "modules a tracking run trained already: that run is continued, and recorded as continued_from)")
    add_run_flags(p, seed_help="data seeds and sampling")
    p.add_argument("--pool", type=int, help=f"training clips generated up front (default {DEFAULTS['pool']})")
    p.add_argument("--windows", type=int, help=f"windows of {WINDOW} frames per step (default {DEFAULTS['windows']})")
    p.add_argument("--lr", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--warmup", type=int, help=f"warmup steps (default {DEFAULTS['warmup']})")
    p.add_argument("--size", type=int, choices=(256, 1024), help=f"the model's input size (default {DEFAULTS['size']})")
    p.add_argument("--workers", type=int, help="clip generation processes (default: CPU count - 1)")
    p.add_argument("--log-every", type=int, help=f"steps between progress lines (default {DEFAULTS['log_every']})")
    p.add_argument("--val-every", type=float, help=f"seconds between validations, 0: only at the end (default {DEFAULTS['val_every']:g})")
    p.add_argument("--val-clips", type=int, help=f"held-out clips of {CLIP_FRAMES} frames (default {DEFAULTS['val_clips']})")
    p.add_argument("--smoke", action="store_true",
                   help=f"prove the pipeline on the CPU: {SMOKE['steps']} steps of {SMOKE['windows']} windows, "
                        f"{SMOKE['pool']} clips, validation on {SMOKE['val_clips']} clip")
    args = p.parse_args(argv)
    for name, value in ({**DEFAULTS, **SMOKE} if args.smoke else DEFAULTS).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    manifest = args.init.with_suffix(".json")
    if not args.init.is_file() or not manifest.is_file():
        p.error(f"--init {args.init}: the image run's checkpoint and its manifest {manifest.name} are needed; "
                f"make them with `python -m tinysam.train --model {FAMILY.model_type}`")
    return args


def validate(predictor, clips) -> dict:
    """J&F against the ground truth over every object and frame of the clips, and J over the tracked
    frames (those after an object's click) alone, as the video gate tracks them."""
    set_tracking_mode(predictor.model, training=False)
    jf, j_tracked = [], []
    for clip in clips:
        outputs = track_clip(predictor, clip)
        clicked = {obj_id - 1: frame for obj_id, frame, _ in prompts(clip)}
        for o in range(clip.masks.shape[0]):
            for t in range(clip.masks.shape[1]):
                ours, truth = outputs.masks[o, t], clip.masks[o, t]
                j = mask_iou(ours, truth)
                jf.append((j + boundary_f(ours, truth)) / 2)
                if t > clicked.get(o, t):
                    j_tracked.append(j)
    set_tracking_mode(predictor.model, training=True)
    return {"jf": float(np.mean(jf)), "j_tracked": float(np.mean(j_tracked)), "clips": len(clips),
            "object_frames": len(jf)}


def log_fields(result: dict) -> dict:
    """A validation's figures as the log's columns."""
    return {"val_jf": result["jf"], "val_j_tracked": result["j_tracked"]}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python -m tinysam.train_tracking " + shlex.join(sys.argv[1:] if argv is None else argv)
    start = _START if argv is None else time.monotonic()
    deadline = start + 60.0 * args.minutes

    def log(message: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)

    # the clip workers fork before anything starts CUDA in this process
    pool = build_clip_pool(args.pool, args.seed, args.size, args.workers, log)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    if cuda:
        train_in_tf32()
    predictor = build_sam_video(FAMILY.model_type, args.init, device=device, stages="fp32")
    model = at_input_size(predictor.model, args.size)
    trainable = prepare_for_tracking(model)
    heldout = [generate_clip(video_id, seed=HELDOUT_SEED, frames=CLIP_FRAMES) for video_id in range(1, args.val_clips + 1)]
    before = validate(predictor, heldout)
    log(f"model: {FAMILY.model_type} from {args.init}, training {sum(p.numel() for p in trainable) / 1e6:.2f} M "
        f"parameters ({', '.join(VIDEO_MODULES)}) at input {args.size} on "
        f"{torch.cuda.get_device_name(device) + ' (bf16 autocast)' if cuda else 'cpu (fp32)'}; "
        f"{args.windows} windows of {WINDOW} frames a step; held-out J&F before: {before['jf']:.4f} "
        f"(J of tracked frames {before['j_tracked']:.4f})")

    sampler = WindowSampler(pool, args.windows, args.seed, device)
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    run = Run(step=tracking_step(model, trainable, sampler, optimizer, training_autocast(device)),
              validate=lambda: log_fields(validate(predictor, heldout)),
              describe=lambda fields: f"held-out J&F {fields['val_jf']:.4f}, J of tracked frames {fields['val_j_tracked']:.4f}",
              final_reserve=lambda val_seconds: 2 * val_seconds + 30.0,  # the final validation (true fp32), the files
              calibrate_steps=CALIBRATE_STEPS)
    rows, state = run_schedule(run, optimizer, device, args, deadline, start, log)
    return finish(model, predictor, heldout, before, rows, state, args, command, start, log)


def tracking_step(model, trainable: list[torch.nn.Parameter], sampler: WindowSampler, optimizer, autocast):
    """One optimization step on a batch of windows, as tinysam.loop.run_schedule calls it."""

    def step(step: int, total: int) -> tuple[torch.Tensor, dict]:
        batch = sampler.sample()
        with autocast:
            outputs = track_windows(model, batch)
        loss, parts = tracking_loss(outputs, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        return loss, parts

    return step


def finish(model, predictor, heldout, before: dict, rows: list[dict], state: dict, args, command: str, start: float, log) -> dict:
    """Save the checkpoint, validate the saved file as users load it, extend the image run's manifest."""
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / FAMILY.checkpoint_name
    sha256 = save_checkpoint(model, path, FAMILY.fp32_keys, FAMILY.wrap_key)
    if model.device.type == "cuda":
        no_tf32()  # true fp32 for the reported figures, as the gate's goldens
    saved = build_sam_video(FAMILY.model_type, path, device=model.device, stages="fp32")
    at_input_size(saved.model, args.size)
    after = validate(saved, heldout)
    log(f"final held-out J&F {after['jf']:.4f} (before {before['jf']:.4f}), J of tracked frames "
        f"{after['j_tracked']:.4f} (before {before['j_tracked']:.4f})")
    rows.append({"step": state["steps"], "seconds": round(time.monotonic() - start, 1), **log_fields(after)})
    manifest = json.loads(args.init.with_suffix(".json").read_text())
    init_sha = manifest["sha256"]
    # An init that a tracking run made already (the packaged file is one) is continued: its run is kept, nested.
    earlier = manifest.pop("tracking", None)
    manifest.update(sha256=sha256, bytes=path.stat().st_size)
    manifest["tracking"] = {
        "init": f"{args.init.name} (sha256 {init_sha}): the image run above"
                + (", its video modules from the tracking run under continued_from" if earlier else ""),
        **({"continued_from": earlier} if earlier else {}),
        "command": command,
        "replay": f"{command} --steps {state['steps']}" if args.steps is None else command,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "trained_modules": list(VIDEO_MODULES),
        "frozen": "the image path (trunk, neck, prompt encoder, decoder but its object-score head, no_mem_embed): "
                  "the image run's tensors",
        "steps": state["steps"],
        "planned_steps": state["planned_steps"],
        "train_seconds": round(state["seconds"], 1),
        "total_seconds": round(time.monotonic() - start, 1),
        "data": f"generated clips (parity.golden.videos) of {CLIP_FRAMES} frames, seed {args.seed} + 5000, "
                f"{args.pool} clips; windows of {WINDOW} frames at stride 1 or 2, forwards or backwards, flipped",
        "optimizer": "AdamW", "lr": args.lr, "weight_decay": args.weight_decay, "warmup_steps": state["warmup"],
        "schedule": "linear warmup, cosine to 1% of lr", "grad_clip": 1.0,
        "precision": "bf16 autocast" if model.device.type == "cuda" else "fp32",
        "loss": "tracked frames: 20 focal + dice on the low-res mask where the object is present and scored "
                "present; every frame: + BCE of the object score vs present",
        "validation": {"heldout_clips_seed": HELDOUT_SEED, "input_size": args.size, "before": before, "after": after},
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu",
        "smoke": args.smoke,
    }
    write_json(args.out / FAMILY.manifest_name, manifest)
    write_log_csv(args.out / LOG_NAME, rows, LOG_FIELDS)
    plot_curve(args.out / CURVE_NAME, [{"step": 0, **log_fields(before)}, *rows],
               {"loss": "total", "mask": "mask (20 focal + dice)", "object": "object score BCE"},
               {"val_jf": "J&F, every frame", "val_j_tracked": "J, tracked frames"},
               ("tracking loss", f"held-out clips (seed {HELDOUT_SEED}) vs ground truth"))
    log(f"wrote {path} ({manifest['bytes'] / 2**20:.1f} MiB, sha256 {sha256[:12]}), manifest, log and curve; "
        f"{state['steps']} steps in {state['seconds']:.0f} s")
    return manifest


if __name__ == "__main__":
    main()
