"""Train the small SAM 3 (sam3_tiny) to find concepts in generated scenes, for a packaged "trained"
SAM 3 checkpoint that the concept gate can run (docs/sam3.md says where that stands).

    python -m tinysam.train_concept [--minutes 6] [--seed 0] [--out samfast/weights] [--device cuda] [--smoke]

Seeded weights score every query alike, so a concept golden made with them gates numerics only. This
script gives sam3_tiny detections worth comparing: it trains samfast's own SAM 3 modules, in sam3.pt's
layout, on generated scenes (tinysam.concept_data), asking each image for every scene category's name
("ellipse", "rectangle", "polygon", "star", "blob"), as the concept gate asks: the phrases an image
holds and those it lacks. The loss is DETR's, the kind SAM 3's detector trains with
(tinysam.concept_loss), on the last decoder layer's outputs and, without masks, on each earlier layer's
(auxiliary losses). The text path trains with the image path. Exemplar boxes do not train (the geometry
encoder sees none), nor do the point and box heads (predict_inst), which keep their seeded init, saved
so that the file loads strictly.

Training seeds are tinysam.data's, disjoint from the embedded evaluation set (generate_scenes(16, seed=0))
and the held-out set (generate_scenes(64, seed=999)). The run fits --minutes: after CALIBRATE_STEPS the
step count is fixed from the measured speed, so the cosine schedule ends on time; `--steps N` replays a
run step for step (the manifest records N). Validation is the gate's: Sam3Processor at the confidence
threshold 0.5, cgF1 against the scenes' instances (parity.tasks.concept.ground_truth).

Outputs in --out, each written under a temporary name, then renamed (tinysam.outputs): sam3_tiny_trained.pt
(sam3.pt's layout, fp16 but for the computed tables), its manifest sam3_tiny_trained.json (sha256,
command, steps, seeds, final cgF1, torch and GPU), sam3_tiny_training_log.csv and
sam3_tiny_training_curve.png.
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
from parity.tasks.concept.ground_truth import concept_f1  # noqa: E402
from parity.tasks.concept.produce import detect, phrases_of  # noqa: E402
from samfast import build_sam  # noqa: E402
from samfast.sam3.checkpoint import DETECTOR_PREFIX, synthetic_state_dict  # noqa: E402
from samfast.sam3.boxes import inverse_sigmoid  # noqa: E402
from samfast.sam3.config import PIXEL_MEAN, PIXEL_STD, sam3_config  # noqa: E402
from samfast.sam3.image_model import FindInput  # noqa: E402
from tinysam.concept_data import PHRASES, ConceptPool, build_concept_pool  # noqa: E402
from tinysam.concept_loss import LOSS_PARTS, concept_loss  # noqa: E402
from tinysam.loop import train_in_tf32, training_autocast  # noqa: E402
from tinysam.optimizer import learning_rate, make_optimizer  # noqa: E402
from tinysam.outputs import plot_curve, save_state, write_json, write_log_csv  # noqa: E402
from tinysam.validation import HELDOUT_IMAGES, HELDOUT_SEED, heldout_dataset  # noqa: E402

MODEL_TYPE = "sam3_tiny"
CHECKPOINT_NAME = f"{MODEL_TYPE}_trained.pt"
LOG_NAME, CURVE_NAME = f"{MODEL_TYPE}_training_log.csv", f"{MODEL_TYPE}_training_curve.png"
CONFIDENCE_THRESHOLD = 0.5  # Sam3Processor's default, the gate's for this model
TARGET_CGF1 = 0.5  # held-out cgF1 a full run should reach: most instances found, few false detections
CALIBRATE_STEPS = (10, 30)  # steps between which the speed is measured
SCHEDULE_MARGIN = 0.95  # of the measured speed, so the cosine ends before the budget does
VAL_IMAGES = 32  # held-out scenes per validation during the run (all HELDOUT_IMAGES at the end)
LOG_FIELDS = ("step", "seconds", "lr", "loss", *LOSS_PARTS, "val_cgf1")
RUN_DEFAULTS = dict(pool=4000, batch=16, lr=5e-4, weight_decay=0.05, warmup=100, val_every=45.0, log_every=50)
SMOKE_DEFAULTS = dict(pool=4, batch=2, lr=5e-4, weight_decay=0.05, warmup=1, val_every=0.0, log_every=1, steps=3)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tinysam.train_concept", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=6.0, help="wall-clock budget of the whole run")
    p.add_argument("--seed", type=int, default=0, help="weights init and training data seed")
    p.add_argument("--out", type=Path, default=Path("samfast/weights"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=None, help="fixed step count (replays a run; else from --minutes)")
    p.add_argument("--smoke", action="store_true", help="a few steps on a tiny pool: checks the plumbing")
    for name in RUN_DEFAULTS:
        p.add_argument(f"--{name.replace('_', '-')}", type=type(RUN_DEFAULTS[name]), default=None)
    args = p.parse_args(argv)
    defaults = SMOKE_DEFAULTS if args.smoke else RUN_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def normalized(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> Sam3Processor's input: [0, 1], then (x - mean) / std."""
    mean = torch.tensor(PIXEL_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(PIXEL_STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std


def training_step(model, pool: ConceptPool, picked: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The loss of every phrase on each picked scene: len(picked) x len(PHRASES) prompts."""
    backbone_out = model.backbone.forward_image(normalized(pool.images[picked]))
    backbone_out.update(model.backbone.forward_text(list(PHRASES), device=model.device))
    images, phrases = len(picked), len(PHRASES)
    img_ids = torch.arange(images, device=model.device).repeat_interleave(phrases)
    text_ids = torch.arange(phrases, device=model.device).repeat(images)
    captured = {}
    hook = model.transformer.decoder.register_forward_hook(
        lambda module, args, output: captured.update(args=args, output=output))
    try:
        out = model.forward_grounding(backbone_out, FindInput(img_ids, text_ids), model.empty_prompt(images * phrases))
    finally:
        hook.remove()
    # each prompt's image's objects, those of its phrase marked
    scene = picked[img_ids]
    truth = (pool.boxes[scene], pool.masks[scene].float(), pool.labels[scene] == text_ids[:, None])
    loss, parts = concept_loss(out, *truth)
    for earlier in layer_outputs(model, captured["args"], captured["output"])[:-1]:  # DETR's auxiliary losses
        loss = loss + concept_loss(earlier, *truth)[0]
    return loss, parts


def layer_outputs(model, decoder_args: tuple, decoder_output: tuple) -> list[dict]:
    """Each decoder layer's scores, boxes and presence, made from the decoder's inputs and outputs as
    forward_grounding makes the last layer's, for DETR's auxiliary losses."""
    decoder = model.transformer.decoder
    _, _, prompt, prompt_mask, _ = decoder_args
    states, start_boxes, presence_logits, _ = decoder_output
    outputs = []
    for layer in range(states.shape[0]):
        queries = states[layer].transpose(0, 1)  # (P, Q, C)
        boxes = (inverse_sigmoid(start_boxes[layer].transpose(0, 1)) + decoder.bbox_embed(queries).float()).sigmoid()
        outputs.append({"pred_logits": model.dot_prod_scoring(queries[None], prompt, prompt_mask)[0],
                        "pred_boxes": boxes, "presence_logit_dec": presence_logits[layer].transpose(0, 1)})
    return outputs


def validate(model, dataset) -> float:
    """cgF1 of the model through Sam3Processor on `dataset`, every category's name asked of every image (the
    model trains in eval mode: SAM 3's modules here have no dropout, so the two modes compute the same)."""
    detected = detect(model, dataset, phrases_of(dataset), CONFIDENCE_THRESHOLD, desc=f"cgF1 on {dataset.name}")
    return concept_f1(dataset, detected.images, CONFIDENCE_THRESHOLD).cgf1


def save_checkpoint(model, path: Path, seed: int) -> str:
    """sam3.pt's layout: the seeded file with the detector's trained tensors in place, floats in fp16 but
    for the model's buffers (computed tables: RoPE, positions), kept in fp32; its sha256."""
    state = synthetic_state_dict(MODEL_TYPE, seed)
    buffers = {DETECTOR_PREFIX + name for name, _ in model.named_buffers()}
    for name, tensor in model.state_dict().items():
        state[DETECTOR_PREFIX + name] = tensor
    return save_state({k: v.detach().cpu().to(torch.float32 if k in buffers else torch.float16).contiguous()
                       if v.is_floating_point() else v.detach().cpu() for k, v in state.items()}, path)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python -m tinysam.train_concept " + shlex.join(sys.argv[1:] if argv is None else argv)
    deadline = _START + 60 * args.minutes
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        train_in_tf32()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - _START:7.1f} s] {message}", flush=True)

    config = sam3_config(MODEL_TYPE)
    mask_size = 4 * config.grid_size
    workers = 1 if args.smoke else max(1, (os.cpu_count() or 2) - 1)
    pool = build_concept_pool(args.pool, args.seed, config.image_size, mask_size, workers).to(device)
    log(f"pool: {len(pool)} scenes at {config.image_size} px, masks {mask_size} x {mask_size}")
    heldout = heldout_dataset(2 if args.smoke else VAL_IMAGES)
    model = build_sam(MODEL_TYPE, seed=args.seed, device=device)
    model.requires_grad_(True)
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    generator = torch.Generator(device).manual_seed(args.seed)
    rows, total, step, last_val, calibrated_at = [], args.steps, 0, time.monotonic(), None
    train_start = time.monotonic()
    while total is None or step < total:
        if total is None and step == CALIBRATE_STEPS[0]:
            calibrated_at = time.monotonic()
        if total is None and step == CALIBRATE_STEPS[1]:
            per_step = (time.monotonic() - calibrated_at) / (CALIBRATE_STEPS[1] - CALIBRATE_STEPS[0])
            total = step + int(SCHEDULE_MARGIN * max(0.0, deadline - time.monotonic()) / per_step)
            log(f"{per_step * 1000:.0f} ms a step: {total} steps in all")
        lr = learning_rate(step, total or 10 ** 9, args.warmup, args.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        picked = torch.randint(len(pool), (args.batch,), device=device, generator=generator)
        with training_autocast(device):
            loss, parts = training_step(model, pool, picked)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if args.steps is None and time.monotonic() > deadline:  # validations took more than the margin
            log(f"the --minutes budget is spent at step {step} of {total}: stopping before the schedule's end")
            total = step
        if step % args.log_every == 0 or step == total:
            row = {"step": step, "seconds": round(time.monotonic() - _START, 1), "lr": lr, "loss": loss.item(),
                   **{name: value.item() for name, value in parts.items()}}
            if args.val_every and time.monotonic() - last_val > args.val_every:
                row["val_cgf1"] = validate(model, heldout)
                last_val = time.monotonic()
            rows.append(row)
            log(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    train_seconds = time.monotonic() - train_start
    return finish(model, rows, args, command, step, train_seconds, log)


def finish(model, rows: list[dict], args, command: str, steps: int, train_seconds: float, log) -> dict:
    """Save the weights, measure the saved file as users load it, write manifest, log and curve."""
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / CHECKPOINT_NAME
    sha256 = save_checkpoint(model, path, args.seed)
    if model.device.type == "cuda":
        no_tf32()  # true fp32 for the reported figures, as the gate's goldens
    trained = build_sam(MODEL_TYPE, checkpoint=path, device=model.device)
    final = {"heldout": validate(trained, heldout_dataset(2 if args.smoke else HELDOUT_IMAGES)),
             "scenes": validate(trained, load_dataset("scenes", limit=2 if args.smoke else None))}
    log(f"final cgF1: held-out {final['heldout']:.4f}, embedded scenes {final['scenes']:.4f}")
    rows.append({"step": steps, "seconds": round(time.monotonic() - _START, 1), "val_cgf1": final["heldout"]})
    manifest = {
        "checkpoint": CHECKPOINT_NAME,
        "sha256": sha256,
        "bytes": path.stat().st_size,
        "model_type": MODEL_TYPE,
        "layout": "sam3.pt's (detector. and tracker. keys); fp16 tensors but the detector's buffers (fp32)",
        "command": command,
        "replay": f"{command} --steps {steps}" if args.steps is None else command,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "steps": steps,
        "train_seconds": round(train_seconds, 1),
        "images_seen": steps * args.batch,
        "phrases": list(PHRASES),
        "data": {"pool_scenes": args.pool, "train_seeds": "tinysam.data.train_seeds(seed, pool)",
                 "heldout": {"seed": HELDOUT_SEED, "images": HELDOUT_IMAGES}, "embedded_eval": {"seed": 0, "images": 16}},
        "training": {"init": f"synthetic_state_dict({MODEL_TYPE!r}, seed={args.seed})", "optimizer": "AdamW",
                     "lr": args.lr, "weight_decay": args.weight_decay, "warmup_steps": args.warmup,
                     "schedule": "linear warmup, cosine to 1% of lr", "grad_clip": 1.0,
                     "precision": "bf16 autocast" if model.device.type == "cuda" else "fp32",
                     "loss": "DETR's: Hungarian match; focal class, L1 + GIoU boxes, 20 focal + dice masks, "
                             "presence BCE (tinysam.concept_loss)",
                     "untrained": "exemplar boxes (geometry encoder) and predict_inst's heads: seeded init"},
        "validation": {"confidence_threshold": CONFIDENCE_THRESHOLD, "cgf1": final},
        "target_cgf1": TARGET_CGF1,
        "meets_target": final["heldout"] >= TARGET_CGF1,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu",
        "smoke": args.smoke,
    }
    write_json(args.out / path.with_suffix(".json").name, manifest)
    write_log_csv(args.out / LOG_NAME, rows, LOG_FIELDS)
    plot_curve(args.out / CURVE_NAME, rows, {"loss": "total", **{name: name for name in LOSS_PARTS}},
               {"val_cgf1": f"held-out (seed {HELDOUT_SEED}) cgF1"}, ("training loss", "validation cgF1"),
               ((steps, final["scenes"], "final, embedded scenes", "s"),), TARGET_CGF1)
    log(f"wrote {path} ({manifest['bytes'] / 2**20:.1f} MiB, sha256 {sha256[:12]}), manifest, log and curve; "
        f"{steps} steps in {train_seconds:.0f} s")
    return manifest


if __name__ == "__main__":
    main()
