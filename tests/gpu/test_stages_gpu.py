"""Every ladder stage on the GPU against true fp32 (TF32 off), on seeded synthetic weights.

The model is vit_b_2block (samfast/sam1/config.py): vit_b's widths, one windowed and one global block.
The tests need each switch's code paths, not the depth; the perf layer and the parity checks keep
the full-depth models. test_planted_global_block_defect_fails_the_stage_check shows a defect of the
global block alone still fails here.

For each stage: image embeddings and low-res logits within the stage's max_logits_rel_l2 and
predicted IoUs within its max_score_abs_err (parity/budgets.toml, [accuracy.<stage>]); a stage
with the compile switch must also run batches of 1, 2 and 3 images (static batch 2: padded, split)
with no graph break and no recompile. The nt switch must give the per-image loop's answers.

Compile mode is `default` here to keep compile time down; max-autotune changes kernel choice,
not the graph, and is what bench.ladder times. Models come from the session's model cache
(parity.gate.models), shared with tests/gpu/test_syncs_gpu.py: each stage is built and compiled
once; the cache compiles it at build (its warm-up), so the tests here assert that this first
compile was clean and that their own inputs then compile nothing new.
"""

from __future__ import annotations

import copy

import pytest
import torch

import samfast
from parity.checks.compile import watch
from parity.gate.models import xdist_group
from samfast import SamPredictor
from samfast.stages import FP8, LADDER, SPARSE_WITHOUT_INT8, StageError, parse_stages
from tests.planted import relpos_bias_scaled_in_global_blocks
from tests.stage_accuracy import (
    assert_close_to_fp32,
    random_scene,
    stage_outputs,
    tf32_off,
    true_fp32_outputs,
)
from tests.stage_accuracy import rel_l2 as _rel_l2

MODEL = "vit_b_2block"  # correctness, not depth: tests/gpu/test_syncs_gpu.py's SHARED names the same model
STATIC_BATCH = 2
SIZES = [(480, 640), (1024, 768), (300, 500)]  # 3 images: one full batch of 2, then 1 padded
PROMPTS_PER_IMAGE = [3, 7, 1]
STAGES = [*LADDER[1:], SPARSE_WITHOUT_INT8, FP8]
COMPILE_MODE = "default"  # correctness layers: the graph, not the fastest kernels
pytestmark = pytest.mark.gpu


def shared(stages: str):
    """A test of this stage's shared model: on the worker that builds it (tests/gpu/test_syncs_gpu.py shares it too)."""
    return pytest.mark.xdist_group(xdist_group(MODEL, stages, batch=STATIC_BATCH, compile_mode=COMPILE_MODE))


@pytest.fixture(scope="module")
def scene():
    return random_scene(SIZES, PROMPTS_PER_IMAGE)


def _shared(model_cache, stages: str):
    """The session's model of this stage (eval + no_grad use only) and its cache entry."""
    return model_cache.entry(MODEL, stages, batch=STATIC_BATCH, compile_mode=COMPILE_MODE, device="cuda")


@pytest.fixture(scope="module")
def fp32_outputs(scene, model_cache):
    return true_fp32_outputs(_shared(model_cache, "fp32").model, scene)


def assert_compiled_cleanly(entry) -> None:
    """The cache's warm-up compiled the model (at least one graph) with no graph break."""
    entry.warmup.assert_clean()
    assert entry.warmup.graphs_compiled >= 1, "the compile switch is on but nothing was compiled"


@pytest.mark.parametrize("stages", [pytest.param(s, marks=shared(s)) for s in STAGES])
def test_stage_close_to_fp32(stages, scene, fp32_outputs, model_cache):
    try:
        entry = _shared(model_cache, stages)
    except StageError as err:
        if "int8 + 2:4 sparse together" in str(err):
            pytest.skip(f"{stages}: {err} ({SPARSE_WITHOUT_INT8} checks 2:4 without int8)")
        raise
    model = entry.model
    with watch() as seen:
        outputs = stage_outputs(model, scene)
    if "compile" in parse_stages(stages):
        assert_compiled_cleanly(entry)
        seen.assert_clean()  # batches of 1, 2 and 3 images, 3, 7 and 1 prompts: nothing new compiled

    assert_close_to_fp32(stages, outputs, fp32_outputs)
    if "sparse" in parse_stages(stages) and "int8" not in parse_stages(stages):
        assert model.image_encoder.sparse_backend in ("cusparselt", "cutlass")


@shared("fp32")
def test_planted_global_block_defect_fails_the_stage_check(scene, fp32_outputs):
    """Planted defect: the global block forgets its rel-pos bias (windowed block untouched). The reduced
    model has one global block of two; the stage check must still fail on it (its CPU twin:
    tests/unit/test_reduced_model.py)."""
    model = relpos_bias_scaled_in_global_blocks(samfast.build_sam(MODEL, device="cuda", stages="fp32"), 0.0)
    with pytest.raises(AssertionError, match="exceeds max_logits_rel_l2"):
        assert_close_to_fp32("fp32", true_fp32_outputs(model, scene), fp32_outputs)


@shared("nt")
def test_nt_equals_the_per_image_loop(scene, model_cache):
    """Same model and encoder; only the decoder path differs: one jagged batch vs one call per image."""
    model = _shared(model_cache, "nt").model
    images, prompts = scene
    nested = SamPredictor(model).predict_batch(images, prompts)
    # a shallow copy shares modules and weights; only its own `switches` lacks nt (the shared model keeps it)
    per_image = copy.copy(model)
    per_image.switches = model.switches - {"nt"}
    loop = SamPredictor(per_image).predict_batch(images, prompts)
    for i, (a, b) in enumerate(zip(nested, loop)):
        assert a.low_res_logits.shape == b.low_res_logits.shape == (PROMPTS_PER_IMAGE[i], 3, 256, 256)
        # bf16 level: the decoder's matmuls see other row counts, hence other kernels and rounding
        assert _rel_l2(a.low_res_logits, b.low_res_logits) < 1e-2, f"image {i}"
        torch.testing.assert_close(a.iou_predictions.float(), b.iou_predictions.float(), rtol=0, atol=1e-2)
        # (masks are not compared: seeded-weight logits are ~0.07, so rounding flips pixels near 0)


@shared("compile")
def test_compiled_encoder_never_recompiles_over_batch_sizes(model_cache):
    entry = _shared(model_cache, "compile")
    assert_compiled_cleanly(entry)
    model = entry.model
    images = torch.rand(3, 3, 1024, 1024, generator=torch.Generator().manual_seed(0)).cuda().to(model.dtype)
    with watch() as seen, torch.no_grad():  # as the predictor calls it (grad mode is one of dynamo's guards)
        one = model.embed_images(images[:1])
        two = model.embed_images(images[:2])
        three = model.embed_images(images)
        one_again = model.embed_images(images[:1])
    seen.assert_clean()
    assert one.shape == (1, 256, 64, 64) and two.shape == (2, 256, 64, 64) and three.shape == (3, 256, 64, 64)
    torch.testing.assert_close(one_again, one, rtol=0, atol=0)  # the output buffer is not reused under us
    # padding is per image: the padded batch's real row equals the same image in a full batch
    assert _rel_l2(two[:1], one) < 1e-2 and _rel_l2(three[:2], two) < 1e-2


def test_measure_sparse_backends_reports_every_backend():
    from samfast.quantize import SPARSE_BACKENDS, measure_sparse_backends

    results = measure_sparse_backends(2048, 768, 768, torch.bfloat16)
    assert set(results) == {"dense", *SPARSE_BACKENDS}
    assert results["dense"]["error"] is None and results["dense"]["us"] > 0
    for name in SPARSE_BACKENDS:
        run = results[name]
        assert (run["error"] is None) != (run["us"] is None), run
        if run["error"] is None:
            assert run["rel_err"] < 1e-2, f"{name} gives a wrong answer: {run}"
    assert any(results[name]["error"] is None for name in SPARSE_BACKENDS), results


def test_fused_relu_gemm_is_the_relu_of_the_linear_at_the_memory_attention_shape():
    """The tracker's linear1 + ReLU (one cuBLASLt GEMM, ReLU epilogue; samfast.modeling.common.linear_relu)
    at sam2's memory-attention MLP shape (8 objects' 4096 tokens, 256 -> 2048) against float64 math: in fp32
    (TF32 off) to fp32 accumulation, in bf16 as close as the unfused linear + ReLU."""
    from samfast.modeling.common import linear_relu

    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8, 4096, 256, device="cuda", generator=g)
    w, b = torch.randn(2048, 256, device="cuda", generator=g) * 256**-0.5, torch.randn(2048, device="cuda", generator=g)
    exact = F.relu(F.linear(x.double(), w.double(), b.double()))
    with tf32_off():
        fp32 = linear_relu(x, w, b).double()
    assert (fp32 - exact).abs().max() < 1e-4
    assert (fp32 >= 0).all()  # the ReLU applied (without it, half the outputs would be negative, down to about -4)
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    fused = (linear_relu(xb, wb, bb).double() - exact).abs().max()
    unfused = (F.relu(F.linear(xb, wb, bb)).double() - exact).abs().max()
    assert fused <= 1.25 * unfused, (fused, unfused)


def test_fused_mlp_gemm_is_the_tanh_gelu_at_vit_b_shape():
    """The compile switch's lin1 + GELU (one cuBLASLt GEMM, GELU epilogue) against float64 math.

    In fp32 (TF32 off) the epilogue's answer is within 1e-4 of the tanh GELU and further than
    that from the exact one somewhere, so a silent change of the epilogue's GELU would show; in
    bf16 it is as close to the exact GELU as the unfused linear + GELU is (bf16 rounding).
    """
    from samfast.modeling.common import linear_gelu_tanh

    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 768, device="cuda", generator=g)
    w, b = torch.randn(3072, 768, device="cuda", generator=g) * 768**-0.5, torch.randn(3072, device="cuda", generator=g)
    pre = F.linear(x.double(), w.double(), b.double())
    tanh, exact = F.gelu(pre, approximate="tanh"), F.gelu(pre)
    with tf32_off():
        fp32 = linear_gelu_tanh(x, w, b).double()
    assert (fp32 - tanh).abs().max() < 1e-4 < (fp32 - exact).abs().max()
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    fused = (linear_gelu_tanh(xb, wb, bb).double() - exact).abs().max()
    unfused = (F.gelu(F.linear(xb, wb, bb)).double() - exact).abs().max()
    assert fused <= 1.25 * unfused, (fused, unfused)
