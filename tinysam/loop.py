"""The training loop: the image run's optimization step (TrainingStep), and the loop around a run's
steps (run_schedule, shared with tinysam.train_tracking), which fits the cosine schedule, the periodic
validations and the final ones into the time budget."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import record_function

from tinysam.configs import VIT_TINY, ModelFamily
from tinysam.data import BatchSampler, DeviceData
from tinysam.losses import embedding_mean_penalty
from tinysam.optimizer import fade_in_weight, learning_rate, make_optimizer
from tinysam.validation import ValidationSet, validate

CALIBRATE_STEPS = (10, 30)  # steps between which the speed is measured (after kernel warm-up)
SCHEDULE_MARGIN = 0.97  # of the measured speed, so the cosine ends before the budget does
LOGGED_PARTS = ("mask", "single", "iou", "object", "embed_mean")  # the loss terms logged, those the run has


def prepare_for_training(model) -> None:
    model.train().requires_grad_(True)
    for module in model.modules():
        if hasattr(module, "attn_impl"):
            module.attn_impl = "sdpa"  # fused attention kernels train several times faster than the math path


def train_in_tf32() -> None:
    """The run's fp32 matmuls and convolutions (outside autocast) in TF32 on the GPU: training tolerates its
    10-bit mantissa. The final validations, the figures a run reports, switch back to true fp32
    (parity.golden.manifest.no_tf32), as the gate's goldens are made."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def training_autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on the GPU; true fp32 on the CPU (bf16 matmuls crawl there)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


class TrainingStep:
    """One optimization step on a sampled batch: encoder, decoder, loss, backward, optimizer, with
    the family's input normalisation, forward and loss (tinysam.configs.ModelFamily).

    compiled: run the encoder, the decoder pass and the loss through torch.compile. On an H100
    that halves a step (16 images x 8 prompts: 115 -> 61 ms, about 75 s of compiling first;
    `python -m bench.train_step_profile`): eager, the step is mostly small elementwise kernels
    (casts, adds, reductions over 128 prompt-sized copies of the image embedding) that inductor
    fuses. The compiled callables are separate objects, so validation keeps running the eager
    model (one image, no grad) without recompiling the training graphs.
    The phases are labelled for torch.profiler (bench.train_step_profile reads them); outside
    a profiler the labels cost microseconds.
    """

    def __init__(self, model, optimizer, compiled: bool, family: ModelFamily = VIT_TINY,
                 embedding_penalty: float = 0.0):
        self.model, self.optimizer = model, optimizer
        self.embedding_penalty = embedding_penalty  # weight of losses.embedding_mean_penalty (0: off)
        self.autocast = training_autocast(model.device)
        self.pixel_stats = family.frame.pixel_stats(model)
        self.encoder, self.decode, self.loss = family.features(model), family.decode, family.loss
        self.fade_in = family.fade_in
        if compiled:
            self.encoder, self.decode, self.loss = (torch.compile(f) for f in (self.encoder, self.decode, self.loss))

    def __call__(self, data: DeviceData, sampler: BatchSampler, fade: float = 1.0) -> tuple[torch.Tensor, dict]:
        """fade: the weight of the family's fade_in part of the forward this step (1: all of it)."""
        model = self.model
        inputs = data.assemble(sampler.sample(), *self.pixel_stats)
        with self.autocast:
            with record_function("encoder"):
                features = self.encoder(inputs["images"])
                if self.fade_in is not None and fade < 1.0:
                    # Eager, between the compiled graphs: a weight that changes every step recompiles nothing.
                    features = self.fade_in(features, fade)
            with record_function("decoder"):
                outputs = self.decode(model, features, inputs)  # (logits, IoU predictions, ...)
        with record_function("loss"):
            loss, parts = self.loss(*outputs, inputs["targets"])
            if self.embedding_penalty:
                # SAM 2's features are (the embedding, its high-resolution levels)
                penalty = embedding_mean_penalty(features[0] if isinstance(features, tuple) else features)
                loss = loss + self.embedding_penalty * penalty
                parts = {**parts, "embed_mean": penalty.detach()}
        self.optimizer.zero_grad(set_to_none=True)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
        return loss, parts


@dataclass
class Run:
    """What a training run plugs into `run_schedule`.

    step(step, total): one optimization step (the learning rate already set); its loss and logged parts.
    validate(): the held-out figures, as log-row fields ({"val_miou": ...}).
    describe(fields): those fields as a log line's words.
    final_reserve(seconds): what the end of the run needs (its final validations, the files), given
    the seconds of one validation.
    calibrate_steps: the steps between which the speed is measured, after the kernels warmed up."""

    step: Callable[[int, int], tuple[torch.Tensor, dict]]
    validate: Callable[[], dict]
    describe: Callable[[dict], str]
    final_reserve: Callable[[float], float]
    calibrate_steps: tuple[int, int] = CALIBRATE_STEPS


def run_schedule(run: Run, optimizer, device: torch.device, args, deadline: float, start: float, log
                 ) -> tuple[list[dict], dict]:
    """The training loop of both tinysam runs. Without --steps it measures its speed over
    run.calibrate_steps and then fixes the step count so that the cosine schedule, the periodic
    validations (every --val-every seconds) and the end fit the budget; a safety stop ends it
    early if the estimate was wrong. Returns the log rows and the run's state."""
    calibrating = args.steps is None
    total = args.steps or 10**9  # set after calibration when the budget decides
    warmup = min(args.warmup, max(1, total // 5))
    final_reserve = 0.0  # set after calibration; only read after it
    first_timed, last_timed = run.calibrate_steps
    # With --steps the schedule is fixed up front; otherwise validations start after calibration.
    next_val = time.monotonic() + args.val_every if not calibrating and args.val_every > 0 else None
    rows: list[dict] = []
    step, running, seen, t_log, s_log, t_cal = 0, None, 0, time.monotonic(), 0, 0.0
    train_start = time.monotonic()
    stopped_early = False

    def validation_row() -> dict:
        fields = run.validate()
        rows.append({"step": step, "seconds": round(time.monotonic() - start, 1), **fields})
        return fields

    while step < total:
        lr = learning_rate(step, total, warmup, args.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, parts = run.step(step, total)
        step += 1
        names = [name for name in LOGGED_PARTS if name in parts]
        values = torch.stack([loss.detach(), *(parts[name] for name in names)])
        running = values if running is None else running + values  # summed on the device: no sync
        seen += 1

        if calibrating and step == first_timed:
            _sync(device)
            t_cal = time.monotonic()
        if calibrating and step == last_timed:
            _sync(device)
            rate = (last_timed - first_timed) / (time.monotonic() - t_cal)
            fields = validation_row()
            # Timed on a second pass: the first one also tunes kernels for the new shapes
            # (cudnn.benchmark), about 5x slower on an H100, and would make the plan reserve too much.
            t_val = time.monotonic()
            run.validate()
            val_seconds = time.monotonic() - t_val
            final_reserve = run.final_reserve(val_seconds)
            left = deadline - time.monotonic() - final_reserve
            periodic = int(left // args.val_every) if args.val_every > 0 else 0
            total = step + max(1, int((left - periodic * val_seconds) * rate * SCHEDULE_MARGIN))
            warmup = min(args.warmup, max(1, total // 5))
            next_val = time.monotonic() + args.val_every if args.val_every > 0 else None
            log(f"calibrated: {rate:.2f} steps/s, validation {val_seconds:.1f} s ({run.describe(fields)}); "
                f"training {total} steps, to end near {deadline - final_reserve - start:.0f} s")

        if step % args.log_every == 0 or step == total:
            now = time.monotonic()
            mean = (running / seen).tolist()
            speed = (step - s_log) / (now - t_log)
            terms = dict(zip(names, mean[1:]))
            rows.append({"step": step, "seconds": round(now - start, 1), "lr": lr, "loss": mean[0], **terms,
                         "steps_per_s": round(speed, 3)})
            memory = f", {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB peak" if device.type == "cuda" else ""
            log(f"step {step}/{total if total < 10**9 else '?'} loss {mean[0]:.4f} "
                f"({', '.join(f'{name} {value:.4f}' for name, value in terms.items())}) lr {lr:.2e} {speed:.2f} steps/s{memory}")
            running, seen, t_log, s_log = None, 0, now, step
        if next_val is not None and time.monotonic() >= next_val and step < total:
            log(f"validation at step {step}: {run.describe(validation_row())}")
            t_log, s_log = time.monotonic(), step  # keep validation time out of the speed figure
            next_val = time.monotonic() + args.val_every
        if calibrating and step > last_timed and time.monotonic() > deadline - final_reserve:
            log(f"time budget reached at step {step} of {total}: stopping early")
            stopped_early = True
            break
    seconds = time.monotonic() - train_start
    return rows, {"steps": step, "planned_steps": total, "warmup": warmup, "seconds": seconds,
                  "stopped_early": stopped_early}


def train(model, data: DeviceData, sampler: BatchSampler, heldout: ValidationSet, args, deadline: float,
          start: float, log, family: ModelFamily = VIT_TINY) -> tuple[list[dict], dict]:
    """The image run: TrainingStep on the sampled batches, validated by held-out point mIoU."""
    train_step = TrainingStep(model, make_optimizer(model, args.lr, args.weight_decay), compiled=args.compile, family=family,
                              embedding_penalty=args.embedding_mean_penalty)

    def final_reserve(val_seconds: float) -> float:
        # The end validates the saved weights in true fp32 (math attention: about twice as slow)
        # on the held-out and embedded scenes, points and boxes (about 1.5 x one kind), and
        # on coco-mini's 21 larger photos; then it saves and plots.
        per_image = val_seconds / len(heldout.samples)
        return 2 * per_image * (1.5 * (len(heldout.samples) + 16) + 2 * 21) + 15.0

    run = Run(step=lambda step, total: train_step(data, sampler, fade_in_weight(step, total, args.high_res_fade_in)),
              validate=lambda: {"val_miou": validate(model, heldout)["point"]["miou"]},
              describe=lambda fields: f"held-out mIoU {fields['val_miou']:.4f} (centre point)",
              final_reserve=final_reserve)
    return run_schedule(run, train_step.optimizer, model.device, args, deadline, start, log)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
