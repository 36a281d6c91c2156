"""The compiled stages never break the graph or recompile, across batch sizes, image sizes and prompt counts.

Runs on the CPU (inductor's C++ backend, or aot_eager where the front end is what is checked) with
vit_tiny: the same dynamo front end and guards as on the GPU, so a graph break or a shape-driven
recompile shows up here first.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import samfast
from parity.checks.compile import watch
from samfast import Prompts

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test builds a new model: without a reset dynamo would count its first compile as a
    recompile of the previous test's encoder (same code object, failed identity guard)."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _image(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _prompts(n: int, h: int, w: int) -> Prompts:
    rng = np.random.default_rng(n)
    points = rng.uniform([0, 0], [w, h], size=(n, 1, 2))
    return Prompts(point_coords=points, point_labels=np.ones((n, 1)))


# batches of 1..3 images of different sizes and prompt counts against a static batch of 2:
# 1 is padded, 2 fits, 3 is split into 2 + 1 (padded)
CALLS = [
    [(300, 400, 1)],
    [(640, 480, 3), (200, 900, 2)],
    [(512, 512, 5), (1000, 100, 1), (37, 60, 2)],
]


def _run_calls(predictor, calls=CALLS) -> list:
    results = []
    for call in calls:
        images = [_image(h, w, seed=i) for i, (h, w, _) in enumerate(call)]
        results += predictor.predict_batch(images, [_prompts(n, h, w) for h, w, n in call])
    return results


@pytest.fixture(scope="module")
def eager_fp32():
    """The eager fp32 model's outputs for CALLS, the trusted path every compiled stage is compared with: one
    eager run for the three stages, not one each (a third of each test's time). The sdpa and nt switches'
    eager outputs equal these to fp32 rounding (measured: logits within 2.2e-6 of values up to 1.7, IoU
    predictions within 6.3e-7), far inside the comparison's 1e-4."""
    return _run_calls(samfast.SamPredictor(samfast.build_sam("vit_tiny", device="cpu", stages="fp32")))


INDUCTOR_SLOW = pytest.mark.slow(reason="inductor compiles the encoder and the decoder: the logits compared with "
                                        "eager's are its code's")
# The sdpa stage's inductor compile is the costly one on the CPU (51 s cold on 2 cores, its attention code
# its own; the nt stage's 15 s, its encoder the plain stage's): the CPU run traces it with aot_eager
# (dynamo's graphs and guards, the padding's effect in the traced graphs), the GPU runners compile it
ON_GPU_RUNNERS = pytest.mark.gpu_runner(reason="inductor's compile of the sdpa stage, 51 s on 2 cores cold; "
                                               "[fp32+compile+sdpa-aot_eager] checks its graphs and logits in the CPU run")
STAGE_RUNS = [*(pytest.param(stages, "inductor", marks=INDUCTOR_SLOW) for stages in ("fp32+compile", "fp32+compile+nt")),
              pytest.param("fp32+compile+sdpa", "aot_eager"),
              pytest.param("fp32+compile+sdpa", "inductor", marks=[INDUCTOR_SLOW, ON_GPU_RUNNERS])]


@pytest.mark.parametrize("stages, compile_backend", STAGE_RUNS, indirect=["compile_backend"])
def test_compiled_stage_is_clean_and_equals_eager(stages, compile_backend, eager_fp32):
    """Across batch sizes, image sizes and prompt counts the compiled stage never breaks the graph or
    recompiles, and its decoder, which pads one prompt or one image to two and cuts the copies off
    again, gives every image the eager fp32 model's logits whatever its prompt count (CALLS has 1..5).
    One compile serves both checks (it is most of the cost)."""
    compiled = samfast.SamPredictor(samfast.build_sam("vit_tiny", device="cpu", stages=stages, batch_size=2))
    with watch() as seen:
        results = _run_calls(compiled)
    seen.assert_clean()
    assert seen.graphs_compiled >= 2  # encoder and mask decoder: the watch saw both compile, so it was looking
    for got, want in zip(results, eager_fp32, strict=True):
        assert got.low_res_logits.shape == want.low_res_logits.shape
        torch.testing.assert_close(got.low_res_logits, want.low_res_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.iou_predictions, want.iou_predictions, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("dynamo_compile")
def test_unpadded_batches_recompile_and_the_check_says_so():
    """Planted defect: without the static batch, a new batch size recompiles and watch() reports it.
    The first two calls (a batch of 1, then of 2) suffice: each new size recompiles the encoder, and the
    check needs only one. The encoder is compiled with dynamic=False, so the recompile is a guard of
    dynamo's on a static shape: dynamo alone shows it as inductor would, without its C++ compiling."""
    model = samfast.build_sam("vit_tiny", device="cpu", stages="fp32+compile", batch_size=2)
    model.static_batch = None  # the defect: batches reach the compiled encoder at their own size
    with watch() as seen:
        _run_calls(samfast.SamPredictor(model), CALLS[:2])
    assert seen.recompiles, "a batch of a new size must show up as a recompile"
    with pytest.raises(AssertionError, match="recompile"):
        seen.assert_clean()
