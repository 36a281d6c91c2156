"""The optimization ladder end to end on the GPU, beside the reference segment_anything (SAM 1) or sam2 (SAM 2).

    python -m bench.ladder [--models vit_b vit_h sam2.1_hiera_l] [--batches 1 8 32] [--stages fp32 bf16 ...]
                           [--reference fp32 bf16] [--out reports/bench] [--budget-s 540]
                           [--compile-mode max-autotune] [--profile [MODEL:BATCH:STAGE]] [--quick]

For every model, batch size and stage (samfast's ladder, plus the reference in fp32 and bf16, in
the same run and process):

  encoder img/s   image encoder alone on a preprocessed (B, 3, 1024, 1024) batch
  e2e img/s       encoder + prompt encoder + mask decoder + upscaling to the original size, with
                  COCO-like prompts: 5..15 single foreground points per image (seeded), 3 masks each
                  (what the published img/s covers: image encoder + predict_torch)
  peak GiB        torch.cuda.max_memory_allocated() over the e2e run, after reset_peak_memory_stats
  first call s    seconds of the first encoder call (torch.compile compiles there; warm-up otherwise)

SAM 2 models (samfast.SAM2_MODEL_TYPES) take the same rows, with what differs chosen by family
(bench.families): the default stages are those built for SAM 2 (fp32 bf16 compile sdpa; another
stage asked for is recorded as not built); the encoder is model.image_features (sam2: forward_image
and what SAM2ImagePredictor.set_image does after it); e2e is the predictor from 640x480 uint8
images, sam2's host-side transform included (samfast: SamPredictor.predict_batch; sam2:
SAM2ImagePredictor.set_image_batch, then per image what its predict_batch does, outputs left on
the device as samfast's are); the reference is sam2 1.1.0 built by build_sam2 with the same seeded
state dict loaded strictly: "reference fp32" as shipped, "reference bf16+compile" its best image
path (compile_image_encoder, under torch.autocast(cuda, bf16); GPU only, skipped on a CPU).

Timing: warm-up calls, then `repeats` runs of `iters` calls each, bracketed by CUDA events (and a
synchronize); the median run is reported. Inputs are random but non-zero and seeded; weights are
seeded synthetic ones in the official layout (samfast.synthetic_state_dict): the same FLOPs and
memory as real checkpoints, meaningless masks. Inputs arrive preprocessed (resize and pixel
normalization are data-loader work, not timed), as in the published benchmark.
Rows are timed one after the other, so a ratio of two rows carries the machine's drift between them
(1.515x and 1.480x for one command on two H200s: docs/history/sam2-encoder-speed.md): for a target
stated as a ratio, time the
two encoders alternating in one process with bench.encoder_ratio.

Robust by design: a configuration that fails (an unsupported stage, out of memory) is recorded
with its error and the run goes on; once --budget-s is spent the remaining configurations are
recorded as skipped. One configuration is never interrupted, and a max-autotune compile of vit_b
takes minutes (ANCHORS.md: 219-293 s), so leave room or pass --compile-mode default.

Writes bench.md, bench.json and bench.png under --out and prints the markdown table last.
Runs on the CPU too, for a smoke test: python -m bench.ladder --quick --models vit_tiny --batches 1
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

import samfast
from bench.families import MODEL_TYPES, by_reference, built_stages, not_built, reference_model, reference_name
from bench.kernel_gaps import gaps
from bench.kernel_gaps import summary as gap_summary
from bench.kernel_kinds import by_kind
from bench.timing import clock_name, command_line, counting_compiles, device_name, fmt, free, peak_gib, reset_peak, sync, time_call, timed_compile_note
from samfast.predictor import Prompts
from samfast.stages import FP8, LADDER, SPARSE_WITHOUT_INT8, SWITCHES, canonical_name, compile_mode, parse_stages

REFERENCE = "reference"
# A family runs those of these that samfast builds for it (bench.families.built_stages): SAM 2 fp32 .. sdpa.
DEFAULT_STAGES = [*LADDER, SPARSE_WITHOUT_INT8, FP8]
# bf16 on a CPU without bf16 matmul units takes minutes per image, compile a minute or two.
CPU_QUICK_STAGES = ["fp32", "fp32+sdpa", "fp32+nt", "fp32+int8", "bf16+sparse"]
# --reference fp32 / bf16 -> the row's stage, by reference package (bench.families.by_reference): sam2's
# bf16 is its compiled path
REFERENCE_STAGES = {"segment_anything": {"fp32": f"{REFERENCE} fp32", "bf16": f"{REFERENCE} bf16"},
                    "sam2": {"fp32": f"{REFERENCE} fp32", "bf16": f"{REFERENCE} bf16+compile"}}
ORIGINAL_SIZE = (480, 640)  # a typical COCO image: resized to 768 x 1024, padded to 1024 x 1024
INPUT_SIZE = (768, 1024)
PROMPTS_PER_IMAGE = (5, 15)  # COCO val2017 has ~7 annotations per image, one point prompt each


@dataclass
class Row:
    model: str
    batch: int
    stage: str  # a samfast stage name, or one of REFERENCE_STAGES
    impl: str  # "samfast" or "reference"
    encoder_img_s: float | None = None
    e2e_img_s: float | None = None
    peak_gib: float | None = None
    encoder_peak_gib: float | None = None
    first_call_s: float | None = None
    build_s: float | None = None
    error: str | None = None
    skipped: str | None = None
    notes: dict = field(default_factory=dict)


# --- inputs --------------------------------------------------------------------------------------
def make_inputs(batch: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A preprocessed image batch (normalized values, zero padding below the 768-row image) and prompts.

    Prompts: per image a seeded number of single-point foreground prompts in the 1024-long frame,
    as (coords (N, 1, 2) float32, labels (N, 1) int32) on the device.
    """
    g = torch.Generator().manual_seed(seed)
    images = torch.zeros(batch, 3, 1024, 1024)
    images[:, :, : INPUT_SIZE[0], : INPUT_SIZE[1]] = torch.randn(batch, 3, *INPUT_SIZE, generator=g)
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(batch):
        n = int(rng.integers(PROMPTS_PER_IMAGE[0], PROMPTS_PER_IMAGE[1] + 1))
        coords = rng.uniform(0, 1, (n, 1, 2)) * np.array([INPUT_SIZE[1] - 1, INPUT_SIZE[0] - 1])
        prompts.append((
            torch.as_tensor(coords, dtype=torch.float, device=device),
            torch.ones(n, 1, dtype=torch.int, device=device),
        ))
    return images.to(device=device, dtype=dtype), prompts


class NotRun(Exception):
    """A configuration this device cannot run: recorded as skipped, with the reason."""


def sam2_e2e_inputs(batch: int, prompts, seed: int = 0) -> tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """SAM 2's e2e inputs: `batch` seeded ORIGINAL_SIZE uint8 RGB images, and make_inputs' prompts in
    their pixels (the same points: SAM 1's frame is the image scaled by 1024 / 640), as host arrays
    (coords (N, 1, 2) float32, labels (N, 1) int32), what a caller hands the predictors."""
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (*ORIGINAL_SIZE, 3), dtype=np.uint8) for _ in range(batch)]
    scale = ORIGINAL_SIZE[1] / INPUT_SIZE[1]
    return images, [((c.cpu().numpy() * scale).astype(np.float32), lab.cpu().numpy()) for c, lab in prompts]


# --- the implementations: samfast and the reference, for each family -----------------------------
class SamfastRunner:
    """samfast at a stage: encoder via embed_images (static batch under compile), decoder per switches."""

    def __init__(self, model_type: str, stage: str, batch: int, device: torch.device, model=None) -> None:
        # model: one built already for these arguments (the gate's model cache); else built here
        self.model = model if model is not None else samfast.build_sam(model_type, device=device, stages=stage, batch_size=batch)
        self.predictor = samfast.SamPredictor(self.model)
        self.dtype = self.model.dtype

    def notes(self) -> dict:
        enc = self.model.image_encoder
        notes = {"switches": sorted(self.model.switches, key=SWITCHES.index)}
        for attr in ("sparse_backend", "sparse_timings", "inductor_flags"):
            if hasattr(enc, attr):
                notes[attr] = getattr(enc, attr)
        return notes

    def encode(self, images):
        return self.model.embed_images(images)

    def e2e_inputs(self, images, prompts):
        """e2e's arguments from make_inputs' (images, prompts): SAM 1 takes them as they are."""
        return images, prompts

    def e2e(self, images, prompts):
        features = self.model.embed_images(images)
        # The predictor's decode step on tensors already in the model's frame (predict_batch
        # minus its host-side image resizing, which the published benchmark leaves to data loaders).
        if "nt" in self.model.switches:
            decoded = self.predictor._decode_nested(features, [(c, lab, None) for c, lab in prompts], True)
        else:
            decoded = [self.predictor._decode(features[i : i + 1], c, lab, None, None, True) for i, (c, lab) in enumerate(prompts)]
        return [self.model.postprocess_masks(low_res, INPUT_SIZE, ORIGINAL_SIZE) > self.model.mask_threshold for low_res, _ in decoded]


class ReferenceRunner:
    """segment_anything with the same seeded weights; bf16 means the encoder in bf16, decoder in fp32.

    (segment_anything's prompt encoder mixes its fp32 positional buffer with the point embeddings,
    so the whole model does not run in bf16; the encoder is where the time goes.)
    """

    def __init__(self, model_type: str, dtype: torch.dtype, device: torch.device) -> None:
        from parity.reference import reference_sam

        self.sam = reference_sam(model_type, samfast.synthetic_state_dict(model_type, seed=0)).to(device)
        self.sam.image_encoder.to(dtype)
        self.dtype = dtype

    def notes(self) -> dict:
        return {"dtype": "encoder bf16, decoder fp32" if self.dtype == torch.bfloat16 else "fp32"}

    def encode(self, images):
        return self.sam.image_encoder(images)

    def e2e(self, images, prompts):
        features = self.sam.image_encoder(images).float()
        masks = []
        for i, (coords, labels) in enumerate(prompts):
            sparse, dense = self.sam.prompt_encoder(points=(coords, labels), boxes=None, masks=None)
            low_res, _ = self.sam.mask_decoder(
                image_embeddings=features[i : i + 1],
                image_pe=self.sam.prompt_encoder.get_dense_pe(),
                sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense,
                multimask_output=True,
            )
            masks.append(self.sam.postprocess_masks(low_res, INPUT_SIZE, ORIGINAL_SIZE) > self.sam.mask_threshold)
        return masks

    def e2e_inputs(self, images, prompts):
        return images, prompts


class Sam2SamfastRunner(SamfastRunner):
    """samfast's SAM 2 at a stage: the encoder is image_features, e2e the predictor's predict_batch."""

    def encode(self, images):
        return self.model.image_features(images)

    def e2e_inputs(self, images, prompts):
        return sam2_e2e_inputs(len(images), prompts)

    def e2e(self, images, prompts):
        return self.predictor.predict_batch(images, [Prompts(coords, labels) for coords, labels in prompts])


def sam2_image_features(sam, batch: torch.Tensor):
    """What sam2's SAM2ImagePredictor.set_image_batch computes after its transforms: the image encoder,
    no_mem_embed added, the three levels as (B, C, H, W); samfast's image_features does the same work."""
    backbone_out = sam.forward_image(batch)
    _, vision_feats, _, feat_sizes = sam._prepare_backbone_features(backbone_out)
    if sam.directly_add_no_mem_embed:
        vision_feats[-1] = vision_feats[-1] + sam.no_mem_embed
    feats = [feat.permute(1, 2, 0).view(batch.shape[0], -1, *size) for feat, size in zip(vision_feats, feat_sizes)]
    return feats[-1], feats[:-1]


class Sam2ReferenceRunner:
    """sam2 1.1.0 with the same seeded weights: fp32 as shipped, or bf16 its best image path (sam2's
    compile_image_encoder, everything under torch.autocast(cuda, bf16), as sam2's notebooks run it)."""

    def __init__(self, model_type: str, precision: str, device: torch.device, mode: str | None = None) -> None:
        from sam2.sam2_image_predictor import SAM2ImagePredictor

        self.bf16 = precision == "bf16"
        if self.bf16 and device.type != "cuda":
            raise NotRun("sam2's compiled bf16 path (torch.autocast on CUDA) runs on a GPU only")
        self.compile_mode = (mode or compile_mode(device)) if self.bf16 else None
        self.sam = reference_model(model_type, device, compile_mode=self.compile_mode)
        self.predictor = SAM2ImagePredictor(self.sam)
        self.dtype = torch.float32  # autocast casts

    def notes(self) -> dict:
        return {"version": importlib.metadata.version("sam2"),
                "dtype": f"autocast bf16, image encoder compiled by sam2 (mode {self.compile_mode})" if self.bf16 else "fp32"}

    def _precision(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    def encode(self, images):
        with self._precision():
            return sam2_image_features(self.sam, images)

    def e2e_inputs(self, images, prompts):
        return sam2_e2e_inputs(len(images), prompts)

    def e2e(self, images, prompts):
        """set_image_batch, then per image what sam2's predict_batch does, less its copy of every output to
        numpy on the host (samfast's predict_batch leaves its outputs on the device)."""
        predictor = self.predictor
        with self._precision():
            predictor.set_image_batch(images)
            outputs = []
            for i, (coords, labels) in enumerate(prompts):
                mask_input, coords_t, labels_t, box = predictor._prep_prompts(coords, labels, None, None, True, img_idx=i)
                outputs.append(predictor._predict(coords_t, labels_t, box, mask_input, True, img_idx=i))
        return outputs


def make_runner(row: Row, device: torch.device, reference_compile_mode: str | None = None):
    """The row's implementation for its model's family; sam2's compiled row in `reference_compile_mode`
    (default: samfast's mode)."""
    samfast_runner, reference_runner = by_reference(RUNNERS, row.model)
    if row.impl != REFERENCE:
        return samfast_runner(row.model, row.stage, row.batch, device)
    precision = next(p for p, stage in by_reference(REFERENCE_STAGES, row.model).items() if stage == row.stage)
    return reference_runner(row.model, precision, device, reference_compile_mode)


def _segment_anything_runner(model_type: str, precision: str, device: torch.device, compile_mode: str | None):
    return ReferenceRunner(model_type, torch.bfloat16 if precision == "bf16" else torch.float32, device)


# by reference package: (samfast's runner, the reference's runner) of a model of that family
RUNNERS = {"segment_anything": (SamfastRunner, _segment_anything_runner), "sam2": (Sam2SamfastRunner, Sam2ReferenceRunner)}


# --- one configuration ---------------------------------------------------------------------------
@torch.no_grad()
def run_config(row: Row, args, device: torch.device, deadline: float, profile: bool) -> None:
    free(device)
    reset_peak(device)
    t0 = time.perf_counter()
    runner = make_runner(row, device, args.reference_compile_mode)
    row.build_s = time.perf_counter() - t0
    row.notes["device"] = device_name(device)
    row.notes.update(runner.notes())
    images, prompts = make_inputs(row.batch, runner.dtype, device)
    row.notes["prompts"] = sum(len(c) for c, _ in prompts)
    e2e_inputs = runner.e2e_inputs(images, prompts)

    t0 = time.perf_counter()
    runner.encode(images)
    sync(device)
    row.first_call_s = time.perf_counter() - t0
    timing = dict(warmup=args.warmup, iters=args.iters, repeats=args.repeats)
    with counting_compiles(row.notes):  # after the first call: its warm-up calls are counted too
        row.encoder_img_s = row.batch / time_call(lambda: runner.encode(images), device, **timing)
    row.encoder_peak_gib = peak_gib(device)
    if time.monotonic() > deadline:
        row.skipped = "e2e not timed: --budget-s spent"
        return
    runner.e2e(*e2e_inputs)  # the decoder's first call (and NestedTensor set-up) is not timed
    sync(device)
    reset_peak(device)
    with counting_compiles(row.notes):
        row.e2e_img_s = row.batch / time_call(lambda: runner.e2e(*e2e_inputs), device, **timing)
    row.peak_gib = peak_gib(device)
    if profile:
        parts = {"encoder": lambda: runner.encode(images), "e2e": lambda: runner.e2e(*e2e_inputs)}
        profiles = {part: profile_kernels(fn, device) for part, fn in parts.items()}
        row.notes["profile"] = {part: top for part, (top, _, _) in profiles.items()}
        row.notes["profile_kinds"] = {part: kinds for part, (_, kinds, _) in profiles.items() if kinds}
        row.notes["profile_gaps"] = {part: found for part, (_, _, found) in profiles.items() if found}


def profile_kernels(fn, device: torch.device, top: int = 10) -> tuple[list[dict], dict[str, float], dict]:
    """The `top` CUDA kernels (on the CPU: operators) by self time over two calls of `fn`, and on a GPU
    every kernel's time per call summed by kind (bench.kernel_kinds) and the GPU's idle time between
    them (bench.kernel_gaps); {} and {} on a CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            fn()
        sync(device)
    events = prof.key_averages()

    def device_us(e) -> float:
        for name in ("self_device_time_total", "self_cuda_time_total"):
            if getattr(e, name, None) is not None:
                return float(getattr(e, name))
        return 0.0

    if device.type == "cuda":
        kernels = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA] or list(events)
        timed = [(device_us(e), e) for e in kernels]
    else:
        timed = [(float(e.self_cpu_time_total), e) for e in events]
    total = sum(t for t, _ in timed) or 1.0
    timed.sort(key=lambda te: te[0], reverse=True)
    kinds = by_kind({e.key: t / 2 for t, e in timed}) if device.type == "cuda" else {}
    return [{"name": e.key, "self_us_per_call": t / 2, "calls": e.count // 2, "share": t / total}
            for t, e in timed[:top]], kinds, trace_gaps(prof, calls=2) if device.type == "cuda" else {}


def trace_gaps(prof, calls: int) -> dict:
    """bench.kernel_gaps' summary of a finished profile, read back from its Chrome trace."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return gap_summary(gaps(events), calls)


# --- the run -------------------------------------------------------------------------------------
def plan(args) -> list[Row]:
    """Every (model, batch, stage): the reference first, then samfast's stages (--stages, else the
    default stages built for the model's family); a stage not built for the family is a skipped row."""
    rows = []
    for model in args.models:
        stages = args.stages if args.stages is not None else built_stages(model, args.default_stages)
        for batch in args.batches:
            rows += [Row(model, batch, by_reference(REFERENCE_STAGES, model)[p], REFERENCE) for p in args.reference]
            rows += [Row(model, batch, stage, "samfast", skipped=not_built(model, stage)) for stage in stages]
    return rows


def profile_target(args, rows: list[Row]) -> tuple[str, int, str] | None:
    """MODEL:BATCH:STAGE from --profile; 'auto': first model, largest batch, and the stage `nt`, else the
    last stage with the nt switch and neither int8 nor sparse, else the last stage."""
    if args.profile is None:
        return None
    if args.profile != "auto":
        model, batch, stage = args.profile.split(":", 2)
        return model, int(batch), canonical_name(parse_stages(stage))
    stages = list(dict.fromkeys(r.stage for r in rows if r.impl == "samfast"))
    if not stages:
        return None
    plain_nt = [s for s in stages if "nt" in parse_stages(s) and not parse_stages(s) & {"int8", "sparse"}]
    stage = "nt" if "nt" in stages else (plain_nt or stages)[-1]
    return args.models[0], max(args.batches), stage


def environment(device: torch.device, command: str, timing: str) -> dict:
    """What a bench of image encoders ran on and how, for its report: the device, the versions, the
    command as given, the weights and the timing as the caller describes it."""
    env = {
        "device": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "command": command,
        "weights": "seeded synthetic (samfast.synthetic_state_dict, seed 0), official layout; the reference loads the same state dict",
        "compile_mode": os.environ.get("SAMFAST_COMPILE_MODE") or ("max-autotune" if device.type == "cuda" else "default"),
        "timing": timing,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }
    for mod in ("triton", "torchao"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - report what is there
            env[mod] = None
    for dist in ("segment_anything", "sam2"):  # the references (neither has a __version__)
        try:
            env[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            env[dist] = None
    if device.type == "cuda":
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return env


def ladder_environment(device: torch.device, args: argparse.Namespace, argv: list[str]) -> dict:
    """environment() for this ladder's run: its command, its timing and the end-to-end prompts."""
    timing = f"{args.warmup} warm-up calls, median of {args.repeats} runs x {args.iters} calls, {clock_name(device)}"
    env = environment(device, command_line("bench.ladder", argv), timing)
    env["prompts"] = (f"{PROMPTS_PER_IMAGE[0]}..{PROMPTS_PER_IMAGE[1]} single-point prompts per image, 3 masks each, "
                      f"original size {ORIGINAL_SIZE[1]}x{ORIGINAL_SIZE[0]}")
    return env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--amg" in argv:  # `nox -s bench -- --amg`: the segment-everything bench instead
        from bench import amg

        return amg.main([a for a in argv if a != "--amg"])
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    if args.compile_mode:
        os.environ["SAMFAST_COMPILE_MODE"] = args.compile_mode
    if device.type == "cpu" and not args.quick:
        print("warning: no CUDA device: timing on the CPU (use --quick for a smoke test)", file=sys.stderr)
    rows = plan(args)
    target = profile_target(args, rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = ladder_environment(device, args, argv)
    earlier = load_earlier(out, rows, env) if args.append else []
    start = time.monotonic()
    deadline = start + args.budget_s
    for i, row in enumerate(rows):
        label = f"[{i + 1}/{len(rows)}] {row.model} bs{row.batch} {row.stage}"
        if row.skipped:  # planned so: a stage not built for the model's family
            print(f"{label}: skipped ({row.skipped[:120]})", file=sys.stderr, flush=True)
            continue
        if time.monotonic() > deadline:
            row.skipped = f"--budget-s {args.budget_s:g} spent"
            print(f"{label}: skipped (budget)", file=sys.stderr, flush=True)
            continue
        profile = target is not None and (row.model, row.batch, row.stage) == target
        try:
            run_config(row, args, device, deadline, profile)
        except NotRun as why:
            row.skipped = str(why)
        except Exception as err:  # noqa: BLE001 - record and go on: one stage must not end the run
            row.error = f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"
            row.notes["traceback"] = traceback.format_exc(limit=-3)
        finally:
            free(device)
        print(f"{label}: {_summary(row)} ({time.monotonic() - start:.0f} s elapsed)", file=sys.stderr, flush=True)
        write_outputs(out, env, earlier + rows)  # after every configuration: a killed run keeps what it has
    table = write_outputs(out, env, earlier + rows)
    print(table)
    return 0


def _summary(row: Row) -> str:
    if row.error:
        return f"ERROR {row.error}"
    parts = [f"encoder {fmt(row.encoder_img_s)} img/s", f"e2e {fmt(row.e2e_img_s)} img/s", f"peak {fmt(row.peak_gib)} GiB",
             f"first call {fmt(row.first_call_s)} s"]
    return ", ".join(parts) + (f" [{row.skipped}]" if row.skipped else "")


# --- outputs -------------------------------------------------------------------------------------
SAM2_ROWS = (
    "- SAM 2 rows: encoder = samfast's image_features / sam2's forward_image + what its set_image does after it; "
    "e2e = the predictor from 640x480 uint8 images, sam2's host-side transform (stretch to 1024x1024, normalize) "
    "included: samfast SamPredictor.predict_batch, sam2 SAM2ImagePredictor.set_image_batch + its predict_batch's "
    "per-image steps (outputs left on the device, as samfast's); reference = sam2 with the same state dict "
    "(load_state_dict strict): fp32 as shipped, bf16+compile = torch.autocast(cuda, bf16) + sam2's "
    "compile_image_encoder (in the compile mode above unless its row's dtype note names another; sam2 ships max-autotune)"
)


REFERENCE_ROWS = {"sam2": SAM2_ROWS}  # by reference package: what its rows measure, where it differs from SAM 1's


def markdown(env: dict, rows: list[Row]) -> str:
    references = {reference_name(r.model) for r in rows}
    lines = [
        "# samfast ladder benchmark",
        "",
        f"- device: {env['device']}" + (f" (sm {env['capability']})" if env.get("capability") else ""),
        f"- torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, torchao {env['torchao']}, python {env['python']}"
        + (f"; reference sam2 {env.get('sam2')}" if "sam2" in references else ""),
        f"- command: `{env['command']}`",
        *[f"- earlier command (--append): `{c}`" for c in env.get("earlier_commands", [])],
        f"- weights: {env['weights']}: speed and memory as real checkpoints, masks meaningless",
        f"- timing: {env['timing']}; compile mode {env['compile_mode']}",
        f"- e2e: image encoder + prompt encoder + mask decoder + upscaling; {env['prompts']}",
        *[REFERENCE_ROWS[r] for r in sorted(references) if r in REFERENCE_ROWS],
        "- peak GiB: torch.cuda.max_memory_allocated over the e2e run; first call s: the first encoder call (compile or warm-up)",
        "",
        "| model | batch | stage | encoder img/s | e2e img/s | e2e vs ref fp32 | peak GiB | first call s | note |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    ref = {(r.model, r.batch): r.e2e_img_s for r in rows if r.stage == f"{REFERENCE} fp32"}
    for r in rows:
        base = ref.get((r.model, r.batch))
        speedup = f"{r.e2e_img_s / base:.2f}x" if r.e2e_img_s and base else "-"
        note = r.error or r.skipped or timed_compile_note(r.notes)
        if r.notes.get("device") and r.notes["device"] != env["device"]:
            note = f"measured on {r.notes['device']}" + (f"; {note}" if note else "")
        if r.notes.get("sparse_backend"):
            note = f"2:4 via {r.notes['sparse_backend']}" + (f"; {note}" if note else "")
        lines.append(
            f"| {r.model} | {r.batch} | {r.stage} | {fmt(r.encoder_img_s)} | {fmt(r.e2e_img_s)} | {speedup} | "
            f"{fmt(r.peak_gib)} | {fmt(r.first_call_s, 1)} | {note.replace('|', '/')} |"
        )
    for r in rows:
        if r.notes.get("sparse_timings"):
            lines += ["", f"## 2:4 backends measured for {r.model} bs{r.batch} {r.stage} (one linear, M = 8192 tokens, us)", "",
                      "| linear N x K | dense | cuSPARSELt | CUTLASS |", "|---|---:|---:|---:|"]
            for shape, runs in r.notes["sparse_timings"].items():
                cells = [fmt(runs[k]["us"], 1) if runs[k]["error"] is None else f"error: {runs[k]['error'][:80]}"
                         for k in ("dense", "cusparselt", "cutlass")]
                lines.append(f"| {shape} | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        for part, top in r.notes.get("profile", {}).items():
            what = "CUDA kernels" if "capability" in env else "operators (CPU)"
            lines += ["", f"## Top {len(top)} {what} by self time: {r.model} bs{r.batch} {r.stage}, {part}", "",
                      f"| kernel | us per {part} call | calls | share |", "|---|---:|---:|---:|"]
            for k in top:
                lines.append(f"| `{cell(k['name'], 110)}` | {k['self_us_per_call']:.0f} | {k['calls']} | {100 * k['share']:.1f}% |")
            kinds = r.notes.get("profile_kinds", {}).get(part)
            if kinds:
                total = sum(kinds.values()) or 1.0
                lines += ["", f"Every kernel of the {part} call by kind (bench.kernel_kinds):", "",
                          f"| kind | us per {part} call | share |", "|---|---:|---:|"]
                lines += [f"| {kind} | {us:.0f} | {100 * us / total:.1f}% |" for kind, us in kinds.items()]
                img_s = getattr(r, f"{part}_img_s")
                lines += ["", idle_line(total, r.batch / img_s, part) if img_s else f"(no timed {part} call to hold them against)"]
            found = r.notes.get("profile_gaps", {}).get(part)
            if found:
                said = (f"In the profiled {part} calls the GPU idled {found['idle_us_per_call']:.0f} us a call in "
                        f"{found['gaps_per_call']:.0f} gaps; {found['host_bound_us_per_call']:.0f} us of it host-bound (the next "
                        "operation launched after the GPU ran dry: bench.kernel_gaps). The longest:")
                lines += ["", said, "", "| idle us | after | before | launched late us | host op |", "|---:|---|---|---:|---|"]
                lines += [f"| {g['idle_us']:.0f} | `{cell(g['after'])}` | `{cell(g['before'])}` | {g['launched_late_us']:.0f} | "
                          f"{cell(g['host_op']) or '-'} |" for g in found["longest"]]
    return "\n".join(lines) + "\n"


def cell(name: str, width: int = 60) -> str:
    """A kernel or operator name cut to fit a markdown table cell."""
    return name[:width].replace("|", "/")


def idle_line(kernel_us: float, call_s: float, part: str) -> str:
    """The kernels' time against the timed call's: what is left is time the GPU waited (launch gaps, host work,
    syncs between kernels), which faster kernels cannot win back. The profile at 5d2f225
    found 2.9 of hiera_l's 39.5 ms."""
    call_us = call_s * 1e6
    idle = call_us - kernel_us
    return (f"Kernels {kernel_us / 1e3:.2f} ms of a timed {part} call of {call_us / 1e3:.2f} ms (the table above): "
            f"the GPU idles {idle / 1e3:.2f} ms ({100 * idle / call_us:.1f}%) between them.")


def bar_chart(path: Path, rows: list[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = plt.subplots(2, len(models), figsize=(max(8, 1.1 * len({r.stage for r in rows})) * len(models), 9), squeeze=False)
    for col, model in enumerate(models):
        mine = [r for r in rows if r.model == model]
        stages = list(dict.fromkeys(r.stage for r in mine))
        batches = list(dict.fromkeys(r.batch for r in mine))
        width = 0.8 / len(batches)
        for row_i, (metric, title) in enumerate((("e2e_img_s", "encoder + predict"), ("encoder_img_s", "image encoder only"))):
            ax = axes[row_i][col]
            for j, batch in enumerate(batches):
                values = {r.stage: getattr(r, metric) for r in mine if r.batch == batch}
                xs = np.arange(len(stages)) + (j - (len(batches) - 1) / 2) * width
                heights = [values.get(s) or 0.0 for s in stages]
                bars = ax.bar(xs, heights, width, color=f"C{j}")
                for x, s, bar in zip(xs, stages, bars):
                    if values.get(s) is None:
                        ax.text(x, 0, "err" if any(r.error for r in mine if r.stage == s and r.batch == batch) else "skip",
                                ha="center", va="bottom", rotation=90, fontsize=7)
                    if s.startswith(REFERENCE):
                        bar.set_hatch("//")
            ax.legend(handles=[Patch(facecolor=f"C{j}", label=f"batch {b}") for j, b in enumerate(batches)], fontsize=8)
            ax.set_xticks(np.arange(len(stages)))
            ax.set_xticklabels(stages, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel("img/s")
            ax.set_title(f"{model}: {title} (hatched: reference {reference_name(model)})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_earlier(out: Path, rows: list[Row], env: dict) -> list[Row]:
    """--append: the rows of an earlier bench.json under --out that this run does not redo."""
    path = out / "bench.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    redo = {(r.model, r.batch, r.stage) for r in rows}
    env["earlier_commands"] = old["environment"].get("earlier_commands", []) + [old["environment"]["command"]]
    return [Row(**r) for r in old["results"] if (r["model"], r["batch"], r["stage"]) not in redo]


def write_outputs(out: Path, env: dict, rows: list[Row]) -> str:
    models = list(dict.fromkeys(r.model for r in rows))
    rows = sorted(rows, key=lambda r: (models.index(r.model), r.batch, r.impl != REFERENCE))  # stable: plan order within
    table = markdown(env, rows)
    (out / "bench.md").write_text(table)
    (out / "bench.json").write_text(json.dumps({"environment": env, "results": [asdict(r) for r in rows]}, indent=2, default=str))
    try:
        bar_chart(out / "bench.png", rows)
    except Exception as err:  # noqa: BLE001 - a chart must not cost the numbers
        print(f"bench.png not written: {err}", file=sys.stderr)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ladder", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["vit_b", "vit_h"], choices=MODEL_TYPES,
                   help="SAM 1 and SAM 2 model types (SAM 2: beside the reference sam2)")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--stages", nargs="+", default=None,
                   help=f"samfast stages (ladder names or switches joined by '+'); default: {' '.join(DEFAULT_STAGES)}, "
                        "those built for the model's family (SAM 2: fp32 bf16 compile sdpa); a stage asked for that "
                        "the family has no build of is recorded as not built")
    p.add_argument("--reference", nargs="*", default=None, choices=["fp32", "bf16"],
                   help="reference runs (default: fp32 bf16; none with an empty list): segment_anything for SAM 1 "
                        "(bf16: its encoder in bf16), sam2 for SAM 2 (bf16: autocast bf16 + compile_image_encoder, GPU only)")
    p.add_argument("--out", default="reports/bench")
    p.add_argument("--budget-s", type=float, default=float("inf"),
                   help="skip the configurations left once this many seconds are spent (default: no limit)")
    p.add_argument("--compile-mode", default=None, help="sets SAMFAST_COMPILE_MODE (default: max-autotune on the GPU)")
    p.add_argument("--reference-compile-mode", default=None,
                   help="the mode of sam2's compiled bf16 row (default: --compile-mode's; sam2 ships max-autotune)")
    p.add_argument("--profile", nargs="?", const="auto", default=None, metavar="MODEL:BATCH:STAGE",
                   help="top-10 CUDA kernels of one configuration's e2e run, in bench.md (default: first model, largest batch, nt)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="few iterations (and on the CPU, CPU-friendly stages): a smoke test")
    p.add_argument("--append", action="store_true",
                   help="keep the rows of an earlier bench.json under --out that this run does not redo (split a "
                        "long ladder over several time-limited calls)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    args = p.parse_args(argv)
    cpu = args.cpu or not torch.cuda.is_available()
    defaults = dict(warmup=1, iters=1, repeats=2) if args.quick else dict(warmup=3, iters=10, repeats=5)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    # without --stages, each model runs those of these built for its family (plan)
    args.default_stages = CPU_QUICK_STAGES if (args.quick and cpu) else DEFAULT_STAGES
    if args.reference is None:
        args.reference = ["fp32"] if (args.quick and cpu) else ["fp32", "bf16"]
    if args.stages is not None:
        # canonical names, so "sdpa+bf16" and "bf16+sdpa" are one configuration (and a bad name fails now)
        args.stages = list(dict.fromkeys(canonical_name(parse_stages(s)) for s in args.stages))
    return args


if __name__ == "__main__":
    sys.exit(main())
