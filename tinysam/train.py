"""Train a small SAM from scratch on generated scenes: the packaged "trained" checkpoints.

    python -m tinysam.train [--model vit_tiny] [--minutes 5] [--seed 0] [--out samfast/weights] [--device cuda] [--smoke]

--model vit_tiny (SAM 1, the default) or sam2.1_hiera_nano (the project's small SAM 2); what differs
between them is tinysam.configs' entry for each. The description below is vit_tiny's; SAM 2
differs where its predictor does: images stretched to 1024 x 1024 (so targets cover the whole
256 grid, no padding), the decoder fed the high-resolution levels, prompts encoded as sam2 encodes
them, the object-score head trained too, and the file saved as {"model": state dict}.

Random weights make half-image masks, so mask IoU on them means nothing (DESIGN.md). This script
gives vit_tiny masks worth comparing: it trains samfast's own modules, in the official state-dict
layout, on procedurally generated scenes (parity.golden.scenes) whose instance masks are exact, the way
SAM trains its decoder:

- prompts per object: one positive point, uniform inside the mask or (often) the centre point
  that the published evaluation uses (parity.golden.data.centre_point), or the tight box with jitter;
- supervision of all three multimask outputs with the min-over-outputs rule: focal (x20) + dice
  on the best-matching output only, plus MSE between the IoU head and each output's real IoU
  (the single-mask output 0 learns the same mask loss, so multimask_output=False works too);
- targets in the frame of the decoder's 256x256 logits, which cover the padded 1024 square
  after resize-longest-side (see tinysam.targets.lowres_target): soft area fractions, so the zero crossing
  that `Sam.postprocess_masks` upsamples falls between cells where the true edge lies.

Training seeds (1000 + 10000 * seed + chunk) are disjoint from the embedded evaluation set
(generate_scenes(16, seed=0)) and the held-out validation set (generate_scenes(64, seed=999)).
The whole run, data generation and validation included, fits --minutes: after a short
calibration the step count is fixed from the measured speed, so the cosine schedule ends on
time; `--steps N` replays a run step for step (the manifest records N).

Outputs in --out (each written under a temporary name, then renamed): the family's checkpoint,
vit_tiny_trained.pt (an fp16 state dict) or sam2.1_hiera_nano_trained.pt (sam2's layout,
{"model": fp16 state dict}), both loading with torch.load(weights_only=True); its manifest, the
same name with .json (sha256, command, steps, seconds, seeds, final validation, torch and GPU);
training_log.csv and training_curve.png (for SAM 2 sam2.1_hiera_nano_training_log.csv and
sam2.1_hiera_nano_training_curve.png, so both packaged runs can write to samfast/weights).

This file is the command line and the end of a run (final validation, manifest). The parts live
by concern, shared by both families: tinysam.configs (what differs per family: model, checkpoint,
default settings, and its frame, forward and loss from tinysam.frames, tinysam.forward and
tinysam.losses), tinysam.data (scene pool, sampler), tinysam.targets (low-res targets, flips),
tinysam.optimizer (AdamW, schedule), tinysam.loop (training step and loop), tinysam.validation
and tinysam.outputs (the files).
"""

from __future__ import annotations

import time

_START = time.monotonic()  # the --minutes budget counts from here, before torch is imported

import argparse  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from parity.golden.data import load_dataset  # noqa: E402
from parity.golden.manifest import no_tf32  # noqa: E402
from parity.golden.settings import DataNotFoundError  # noqa: E402
from samfast import build_sam  # noqa: E402
from samfast.checkpoint import WEIGHTS_DIR  # noqa: E402
from tinysam.configs import FAMILIES, VIT_TINY, ModelFamily  # noqa: E402
from tinysam.data import BatchSampler, DeviceData, build_pool  # noqa: E402
from tinysam.loop import prepare_for_training, train, train_in_tf32  # noqa: E402
from tinysam.outputs import plot_curve, save_checkpoint, write_json, write_log_csv  # noqa: E402
from tinysam.validation import HELDOUT_IMAGES, HELDOUT_SEED, ValidationSet, heldout_dataset, validate  # noqa: E402


def _cpu_count() -> int:
    """CPUs this process may run on (a container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Defaults of the flags that size the run rather than the model (the family's settings add the rest).
RUN_DEFAULTS = dict(workers=max(1, _cpu_count() - 1), log_every=25, val_every=30.0, val_images=HELDOUT_IMAGES,
                    high_res_fade_in=0.0, embedding_mean_penalty=0.0)
SMOKE_DEFAULTS = dict(pool=8, steps=3, compile=False, batch=1, prompts=4, warmup=1, workers=1, log_every=1, val_every=0.0,
                      val_images=1, device="cpu")


def _model_flag(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tinysam.train", description=__doc__.split("\n\n")[0], add_help=add_help)
    p.add_argument("--model", choices=list(FAMILIES), default=VIT_TINY.model_type,
                   help=f"the model family to train (default {VIT_TINY.model_type}; see tinysam.configs)")
    return p


def add_run_flags(p: argparse.ArgumentParser, seed_help: str) -> None:
    """The flags of every tinysam run (this one and tinysam.train_tracking): its wall budget, the replay
    of a step count, the seed, the output folder and the device."""
    p.add_argument("--minutes", type=float, default=5.0, help="wall budget of the whole run, data and validation included")
    p.add_argument("--steps", type=int, help="fixed step count (replays a run); default: as many as --minutes allows")
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    p.add_argument("--out", type=Path, default=WEIGHTS_DIR, help=f"output folder (default {WEIGHTS_DIR})")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # The family decides the defaults of the other flags (and their help), so it is read first.
    family = FAMILIES[_model_flag(add_help=False).parse_known_args(argv)[0].model]
    full = {**RUN_DEFAULTS, **family.settings}
    smoke = SMOKE_DEFAULTS
    p = _model_flag()
    add_run_flags(p, seed_help="initial weights, data seeds and sampling")
    p.add_argument("--pool", type=int, help=f"training scenes generated up front (default {full['pool']})")
    p.add_argument("--batch", type=int, help=f"images per step (default {full['batch']})")
    p.add_argument("--prompts", type=int, help=f"prompts (objects) per image (default {full['prompts']})")
    p.add_argument("--lr", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--warmup", type=int, help=f"warmup steps (default {full['warmup']})")
    p.add_argument("--high-res-fade-in", type=float,
                   help="SAM 2: the share of the steps over which the decoder's stride-4/8 inputs are faded in "
                        f"(tinysam.forward.fade_high_res; default {full['high_res_fade_in']:g})")
    p.add_argument("--embedding-mean-penalty", type=float, metavar="WEIGHT",
                   help="add WEIGHT x the squared spatial mean of the image embedding to the loss "
                        "(tinysam.losses.embedding_mean_penalty; what lets the small SAM 2 train; "
                        f"default {full['embedding_mean_penalty']:g}, 0: off)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="torch.compile the training step (default: on the GPU; see TrainingStep)")
    p.add_argument("--workers", type=int, help="data generation processes (default: CPU count - 1)")
    p.add_argument("--log-every", type=int, help=f"steps between progress lines (default {full['log_every']})")
    p.add_argument("--val-every", type=float,
                   help=f"seconds between validations, 0: only at the end (default {full['val_every']:g})")
    p.add_argument("--val-images", type=int, help=f"held-out scenes, generate_scenes seed {HELDOUT_SEED} (default {full['val_images']})")
    p.add_argument("--smoke", action="store_true",
                   help=f"prove the pipeline on the CPU: {smoke['steps']} steps of {smoke['batch']} image x {smoke['prompts']} "
                        f"prompts on {smoke['pool']} scenes, validation on {smoke['val_images']} scene")
    args = p.parse_args(argv)
    # --smoke sizes every flag of the run but the learning rate and weight decay, which stay the family's.
    defaults = {**full, **smoke} if args.smoke else full
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.high_res_fade_in and family.fade_in is None:
        p.error(f"--high-res-fade-in: {family.model_type} has no high-resolution decoder inputs to fade in (SAM 2 has)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    family = FAMILIES[args.model]
    command = "python -m tinysam.train " + shlex.join(sys.argv[1:] if argv is None else argv)
    start = _START if argv is None else time.monotonic()
    deadline = start + 60.0 * args.minutes
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if args.compile is None:
        args.compile = cuda

    def log(message: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)

    def prepare():  # runs while the workers generate the pool
        torch.manual_seed(args.seed)
        if cuda:
            train_in_tf32()
            torch.backends.cudnn.benchmark = True
        model = build_sam(family.model_type, seed=args.seed, device=device, stages="fp32")  # seeded random init
        heldout = ValidationSet.of(f"held-out (seed {HELDOUT_SEED})", heldout_dataset(args.val_images), family.frame)
        embedded = ValidationSet.of("scenes (embedded evaluation)", load_dataset("scenes", limit=args.val_images if args.smoke else None),
                                    family.frame)
        heldout.input_images(model.device), embedded.input_images(model.device)
        return model, heldout, embedded

    # Fork the data workers before anything starts CUDA in this process.
    pool, data_info, (model, heldout, embedded) = build_pool(args.pool, args.seed, args.workers, log, prepare, family.frame)
    if cuda:
        need, free = pool.images.nbytes + pool.targets.nbytes, torch.cuda.mem_get_info(device)[0]
        if need > 0.5 * free:
            raise SystemExit(f"the pool ({need / 2**30:.1f} GiB) would take over half of the free GPU memory "
                             f"({free / 2**30:.1f} GiB): pass a smaller --pool")
    data = DeviceData(pool, device)
    del pool.images, pool.targets  # the device copies are the ones used (on the CPU they share memory)

    prepare_for_training(model)
    log(f"model: {family.model_type} from scratch, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters on "
        f"{torch.cuda.get_device_name(device) + ' (bf16 autocast)' if cuda else 'cpu (fp32)'}"
        f"{', compiled (the first steps compile, about a minute on an H100)' if args.compile else ''}; "
        f"batch {args.batch} images x {args.prompts} prompts"
        f"{f'; the decoder stride-4/8 inputs faded in over the first {args.high_res_fade_in:.0%} of the steps' if args.high_res_fade_in else ''}")
    sampler = BatchSampler(pool, args.batch, args.prompts, args.seed, group_kinds=family.group_kinds)
    rows, state = train(model, data, sampler, heldout, args, deadline, start, log, family)
    return finish(family, model, heldout, embedded, rows, state, data_info, args, command, start, log)


def finish(family: ModelFamily, model, heldout: ValidationSet, embedded: ValidationSet, rows: list[dict], state: dict,
           data_info: dict, args, command: str, start: float, log) -> dict:
    """Save the weights, validate the saved file as users load it, write manifest, log and curve."""
    device = model.device
    cuda = device.type == "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.out / family.checkpoint_name
    sha256 = save_checkpoint(model, ckpt_path, family.fp32_keys, family.wrap_key)
    if cuda:
        no_tf32()  # true fp32 for the reported figures, as the gate's goldens
    trained = build_sam(family.model_type, checkpoint=ckpt_path, device=device, stages="fp32")
    final = {"step": state["steps"]}
    sets = [("heldout", heldout, ("point", "box")), ("scenes", embedded, ("point", "box"))]
    if not args.smoke:
        try:
            sets.append(("coco_mini", ValidationSet.of("coco-mini", load_dataset("coco-mini"), family.frame), ("point",)))
        except DataNotFoundError as err:
            log(f"coco-mini not reported: {str(err).splitlines()[0]}")
    for name, vset, kinds in sets:
        for kind, result in validate(trained, vset, kinds).items():
            final[f"{name}_{kind}"] = result
            log(f"final {vset.name}, {kind}: mIoU {result['miou']:.4f} over {result['count']} objects")
    rows.append({"step": state["steps"], "seconds": round(time.monotonic() - start, 1),
                 "val_miou": final["heldout_point"]["miou"]})

    cfg = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    manifest = {
        "checkpoint": family.checkpoint_name,
        "sha256": sha256,
        "bytes": ckpt_path.stat().st_size,
        "model_type": family.model_type,
        "layout": f"{family.state_dict_layout}; fp16 tensors except {', '.join(family.fp32_keys)}",
        "command": command,
        "replay": f"{command} --steps {state['steps']}" if args.steps is None else command,
        "args": cfg,
        "steps": state["steps"],
        "planned_steps": state["planned_steps"],
        "stopped_early": state["stopped_early"],
        "train_seconds": round(state["seconds"], 1),
        "total_seconds": round(time.monotonic() - start, 1),
        "steps_per_s": round(state["steps"] / state["seconds"], 3),
        "images_seen": state["steps"] * args.batch,
        "data": {**data_info, "heldout": {"seed": HELDOUT_SEED, "images": len(heldout.samples)},
                 "embedded_eval": {"seed": 0, "images": len(embedded.samples), "used_for_training": False}},
        "training": {
            "init": f"synthetic_state_dict({family.model_type!r}, seed={args.seed}) (seeded random)",
            "optimizer": "AdamW", "lr": args.lr, "betas": [0.9, 0.999], "weight_decay": args.weight_decay,
            "warmup_steps": state["warmup"], "schedule": "linear warmup, cosine to 1% of lr", "grad_clip": 1.0,
            **({"high_res_fade_in": f"the decoder's stride-4/8 inputs x step / ({args.high_res_fade_in:g} x steps), "
                                    "up to 1"} if family.fade_in and args.high_res_fade_in > 0 else {}),
            **({"embedding_mean_penalty": f"{args.embedding_mean_penalty:g} x the squared spatial mean of the image "
                                          "embedding (tinysam.losses.embedding_mean_penalty)"}
               if args.embedding_mean_penalty else {}),
            "precision": "bf16 autocast (prompt encoder fp32)" if cuda else "fp32",
            "compiled": args.compile,
            "loss": "min over the 3 multimask outputs of 20 focal (gamma 2, no alpha) + dice, on soft 256x256 "
                    "targets; the same on the single output; + MSE of the IoU head vs each output's IoU"
                    + ("; + BCE of the object-score head vs 1 (an object is present)" if any("object" in row for row in rows) else ""),
            "input_frame": family.frame.name,
            "prompts": "per object: box (p 0.3, jitter 10% of side, at most 20 px), centre point (p 0.4), "
                       "uniform interior point (p 0.3); random horizontal/vertical flips"},
        "validation": {name: value for name, value in final.items() if name != "step"},
        "target_miou": family.target_miou,
        "meets_target": final["heldout_point"]["miou"] >= family.target_miou,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "smoke": args.smoke,
    }
    write_json(args.out / family.manifest_name, manifest)
    write_log_csv(args.out / family.log_name, rows)
    plot_curve(args.out / family.curve_name, rows,
               {"loss": "total", "mask": "mask (20 focal + dice)", "iou": "IoU head MSE", "object": "object score BCE"},
               {"val_miou": f"held-out (seed {HELDOUT_SEED}), point"},
               ("training loss", "validation mIoU (full resolution)"),
               tuple((final["step"], final[name]["miou"], f"final {name.replace('_', ', ')}", marker)
                     for name, marker in (("scenes_point", "s"), ("heldout_box", "^")) if final.get(name)),
               family.target_miou)
    log(f"wrote {ckpt_path} ({manifest['bytes'] / 2**20:.1f} MiB, sha256 {sha256[:12]}), manifest, log and curve; "
        f"{state['steps']} steps in {state['seconds']:.0f} s; held-out point mIoU {final['heldout_point']['miou']:.4f} "
        f"(target {family.target_miou}: {'met' if manifest['meets_target'] else 'NOT met'})")
    return manifest


if __name__ == "__main__":
    main()
