"""The gate's model cache with two compiled stages in one process (CPU, vit_tiny): each stays clean.

What is under test is dynamo's cache of code objects and its guards, not the code inductor generates:
both tests trace with dynamo alone (the dynamo_compile fixture; static shapes, so AOTAutograd would add no
guard), where inductor's C++ compiling of two stages would take minutes on a 2-core CPU.

Two compiled models run the same code objects; with both in dynamo's cache the second one's first
compile is logged as a recompile of the first (seen on the H100: every compiled stage after the
first failed its clean-compile check). The cache keeps one compiled model active, so a test's
watch() sees only what its own inputs cause, whichever shared model ran before.
"""

from __future__ import annotations

import numpy as np
import pytest

import samfast
from parity.checks.compile import watch
from parity.gate.models import ModelCache

pytestmark = pytest.mark.slow

STAGES = ("fp32+compile", "fp32+compile+sdpa")


def _run(model) -> None:
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (40, 56, 3), dtype=np.uint8) for _ in range(3)]
    prompts = [samfast.Prompts(point_coords=rng.uniform(0, 39, (n, 1, 2)), point_labels=np.ones((n, 1))) for n in (1, 4, 2)]
    samfast.SamPredictor(model).predict_batch(images, prompts)


@pytest.mark.slow(reason="two stages traced, and the first traced again after the switch back, each with its warm-up")
@pytest.mark.usefixtures("dynamo_compile")
def test_switching_between_shared_compiled_models_never_shows_a_recompile():
    cache = ModelCache()
    entries = {}
    for stages in (*STAGES, STAGES[0]):  # the first model again, after the second ran
        entry = cache.entry("vit_tiny", stages, batch=2, compile_mode="default", device="cpu")
        entry.warmup.assert_clean()
        assert entry.warmup.graphs_compiled >= 1
        with watch() as seen:
            _run(entry.model)
        seen.assert_clean()
        entries.setdefault(stages, entry)
    assert cache.builds.total() == len(STAGES)  # built once each, compiled again on switching
    assert entries[STAGES[0]] is cache.entry("vit_tiny", STAGES[0], batch=2, compile_mode="default", device="cpu")


@pytest.mark.slow(reason="two compiled stages traced in one dynamo cache, each with its warm-up: the recompile needs both")
@pytest.mark.usefixtures("dynamo_compile")
def test_without_the_switch_the_second_model_shows_a_recompile():
    """The planted defect: two compiled models in dynamo's cache at once (no reset between them)."""
    models = [samfast.build_sam("vit_tiny", device="cpu", stages=s, batch_size=2) for s in STAGES]
    _run(models[0])
    with watch() as seen:
        _run(models[1])
    assert seen.recompiles, "two compiled stages in one dynamo cache should log a cross-model recompile"
