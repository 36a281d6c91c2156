"""Build once per gate run: a cache of built (and, for compiled stages, warmed-up) models shared by layers.

    cache = ModelCache()
    model = cache.get("vit_b", "nt", batch=2, compile_mode="default", device="cuda")   # built here
    model = cache.get("vit_b", "nt", batch=2, compile_mode="default", device="cuda")   # the same object

Keyed by (model, canonical stage name, batch, compile mode, device): "triton" and
"bf16+compile+sdpa+triton" are one entry; the compile mode is part of the key only for stages with
the compile switch (an eager model is the same whatever the mode).

Sharing must not hide a defect, so the cache hands out models for eval + no_grad use only and
checks that they stay as built: a fingerprint (training flag, switches, every parameter's and
buffer's storage and in-place version counter, methods patched onto module instances) is taken
at build and compared on every `get` and by `check_untouched()` (the pytest fixture calls it at
session end). A test that changes a model -- a planted defect, a switch turned off -- builds its
own with samfast.build_sam, or works on a `copy.copy` of the shared one; if it changes the
shared one instead, the gate fails naming the key and what changed.

One compiled model is active at a time. Different stages of one model type run the same code
objects, so with two compiled models in dynamo's cache each one's first compile counts as a
"recompile" of the other's (guards on attn_impl and the like), and a test's `watch()` could not
tell that from a real recompile (measured on the H100: every compiled stage after the first failed
its clean-compile check that way). So handing out a compiled model other than the active one resets
dynamo and warms the model up again (one predict_batch outside any test's watch): each test sees
dynamo as a fresh build would leave it. The model is still built and quantized once; the re-compile
is served by inductor's FX-graph cache (parity.gate.compile_cache), and `Entry.warmup` holds what the
latest warm-up compiled (graphs, graph breaks, recompiles) for the tests that assert on it.
"""

from __future__ import annotations

import gc
import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

import samfast
from parity.checks.compile import CompileWatch, watch
from parity.gate import timing as gate_time
from samfast.stages import canonical_name, parse_stages

# Every stage of a model type compiles the same code objects (encoder forward, predict_masks);
# dynamo's default of 8 cache entries per code object would fall back to eager after 8 models.
RECOMPILE_LIMIT = 64


class SharedModelMutated(AssertionError):
    """A model handed out by the cache was changed by the test that used it."""


@dataclass(frozen=True)
class ModelKey:
    model: str
    stage: str  # canonical name
    batch: int
    compile_mode: str  # "eager" for stages without the compile switch
    device: str

    def __str__(self) -> str:
        mode = "" if self.compile_mode == "eager" else f", {self.compile_mode}"
        return f"{self.model} {self.stage} bs{self.batch}{mode} on {self.device}"


def make_key(model: str, stages: str, *, batch: int, compile_mode: str, device: str | torch.device) -> ModelKey:
    switches = parse_stages(stages)
    mode = compile_mode if "compile" in switches else "eager"
    return ModelKey(model, canonical_name(switches), batch, mode, str(torch.device(device)))


def xdist_group(model: str, stages: str, *, batch: int, compile_mode: str = "default") -> str:
    """The pytest-xdist group of the tests that share this model (--dist loadgroup keeps a group on one
    worker): each shared model is built once, and different models are built on different workers."""
    return str(make_key(model, stages, batch=batch, compile_mode=compile_mode, device="cuda"))


@dataclass
class Entry:
    model: torch.nn.Module
    fingerprint: tuple
    build_seconds: float
    warmup: CompileWatch | None  # None for eager stages


def fingerprint(model: torch.nn.Module) -> tuple:
    """What a test could change on a model: modes, switches, tensors (in place or replaced), patched methods."""
    tensors = tuple(
        (name, _storage_id(t), t._version, t.dtype, t.requires_grad)
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    )
    patched = tuple(
        f"{name}.{attr}"
        for name, module in model.named_modules()
        for attr, value in vars(module).items()
        if callable(value) and callable(getattr(type(module), attr, None))
    )
    training = tuple(name for name, m in model.named_modules() if m.training)
    return (getattr(model, "switches", None), training, tensors, patched)


def _storage_id(t: torch.Tensor) -> int:
    """The storage address; the tensor's identity for wrapper subclasses (torchao's quantized weights) that have none."""
    try:
        return t.data_ptr()
    except RuntimeError:
        return id(t)


def _differences(before: tuple, after: tuple) -> list[str]:
    labels = ("switches", "modules in training mode", "parameters/buffers", "methods patched on instances")
    out = []
    for label, a, b in zip(labels, before, after):
        if a != b:
            if label == "parameters/buffers":
                changed = sorted({x[0] for x in set(a) ^ set(b)})
                out.append(f"{label} changed: {', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}")
            else:
                out.append(f"{label}: {a!r} -> {b!r}")
    return out


@contextmanager
def _compile_mode(mode: str):
    """SAMFAST_COMPILE_MODE for the build only (apply_stages reads it when it calls .compile)."""
    saved = os.environ.get("SAMFAST_COMPILE_MODE")
    os.environ["SAMFAST_COMPILE_MODE"] = mode
    try:
        yield
    finally:
        if saved is None:
            del os.environ["SAMFAST_COMPILE_MODE"]
        else:
            os.environ["SAMFAST_COMPILE_MODE"] = saved


def warm_up(model) -> CompileWatch:
    """Compile encoder and decoder once: 2 small images, 3 and 2 point prompts, through predict_batch."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(2)]
    prompts = [samfast.Prompts(point_coords=rng.uniform(0, 47, (n, 1, 2)), point_labels=np.ones((n, 1))) for n in (3, 2)]
    with watch() as seen:
        samfast.SamPredictor(model).predict_batch(images, prompts)
    return seen


class ModelCache:
    """Built models by ModelKey; `build` is samfast.build_sam's signature (tests pass a counting one)."""

    def __init__(self, build: Callable[..., torch.nn.Module] = samfast.build_sam) -> None:
        self._build = build
        self._entries: dict[ModelKey, Entry] = {}
        self._active: ModelKey | None = None  # the compiled model whose graphs dynamo holds
        self.builds: Counter[ModelKey] = Counter()
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)

    def get(self, model: str, stages: str, *, batch: int, compile_mode: str = "default", device="cuda") -> torch.nn.Module:
        """The shared model of this key, built (and warmed up, if compiled) on first request."""
        return self.entry(model, stages, batch=batch, compile_mode=compile_mode, device=device).model

    def entry(self, model: str, stages: str, *, batch: int, compile_mode: str = "default", device="cuda") -> Entry:
        key = make_key(model, stages, batch=batch, compile_mode=compile_mode, device=device)
        if key in self._entries:
            self._check(key)
            if key.compile_mode != "eager" and key != self._active:
                self._entries[key].warmup = self._activate(key, self._entries[key].model)
            return self._entries[key]
        start = time.perf_counter()
        with _compile_mode(compile_mode):
            built = self._build(model, device=key.device, stages=key.stage, batch_size=batch)
        warmup = self._activate(key, built) if key.compile_mode != "eager" else None
        self.builds[key] += 1
        self._entries[key] = Entry(built, fingerprint(built), time.perf_counter() - start, warmup)
        return self._entries[key]

    def _activate(self, key: ModelKey, model: torch.nn.Module) -> CompileWatch:
        """Make `model` the only compiled model dynamo holds, and compile it (see the module docstring)."""
        gate_time.compile_seconds_so_far()  # read dynamo's compile tally before reset() clears it
        torch._dynamo.reset()
        self._active = key
        return warm_up(model)

    def _check(self, key: ModelKey) -> None:
        entry = self._entries[key]
        changes = _differences(entry.fingerprint, fingerprint(entry.model))
        if changes:
            raise SharedModelMutated(
                f"the shared model [{key}] was changed by a test: {'; '.join(changes)}. Tests get shared "
                "models for eval + no_grad use only: build your own with samfast.build_sam (or change a "
                "copy.copy of it) when the test must change the model."
            )

    def check_untouched(self) -> None:
        for key in self._entries:
            self._check(key)

    def keep_only(self, keep: Entry) -> None:
        """Drop every other entry (checked first): a perf row's peak memory must count its own model alone."""
        self.check_untouched()
        self._entries = {k: e for k, e in self._entries.items() if e is keep}
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
