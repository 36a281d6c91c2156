"""vit_b_2block, the GPU correctness layers' model: vit_b's code paths at two blocks, and what it still catches.

tests/gpu (stages, syncs, segment-everything syncs) builds vit_b_2block instead of the 12-block vit_b:
those tests need each switch's code paths, not the depth. Here, on the CPU: it has exactly the paths
the gate relies on (one windowed and one global block, vit_b's widths, head dim 64 for the Triton
kernels), it equals segment_anything built with the same config in fp32, and the planted defects of
its one global block are seen (the GPU tests plant the same ones: see each test). The perf layer
and the parity checks keep the full-depth models.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from parity.reference import reference_sam
import samfast
from samfast.sam1.config import model_config
from samfast.sam1.image_encoder import resized_rel_pos
from samfast.sam1.sam import build_sam_modules
from tests.planted import global_blocks, item_sync_in_global_attention, relpos_bias_scaled_in_global_blocks
from tests.reference import LOGITS_ATOL, assert_same_outputs, prompt_cases
from tests.stage_accuracy import assert_close_to_fp32

MODEL = "vit_b_2block"
FULL = "vit_b"
GPU_TESTS = Path(__file__).resolve().parents[1] / "gpu"


def _meta(model_type: str):
    with torch.device("meta"):
        return build_sam_modules(model_config(model_type))


def test_config_is_vit_b_widths_with_one_windowed_and_one_global_block():
    reduced, full = model_config(MODEL), model_config(FULL)
    assert dataclasses.replace(reduced, name=FULL, depth=full.depth, global_attn_indexes=full.global_attn_indexes) == full
    assert (reduced.depth, reduced.global_attn_indexes) == (2, (1,))
    assert (reduced.embed_dim, reduced.num_heads, reduced.head_dim, reduced.window_size) == (768, 12, 64, 14)
    blocks = _meta(MODEL).image_encoder.blocks
    assert [b.window_size for b in blocks] == [14, 0]  # block 0 windowed, block 1 global
    assert [tuple(b.attn.rel_pos_h.shape) for b in blocks] == [(27, 64), (127, 64)]  # 14x14 windows, 64x64 tokens


def test_every_module_but_the_blocks_left_out_is_vit_b_s():
    """Same shapes as vit_b everywhere: patch embed, positions, neck, prompt encoder, mask decoder, and
    its block 0 (windowed) and 2 (its first global one) for the reduced model's blocks 0 and 1."""
    reduced = {k: v.shape for k, v in _meta(MODEL).state_dict().items()}
    full = {k: v.shape for k, v in _meta(FULL).state_dict().items()}
    renamed = {"image_encoder.blocks.0.": "image_encoder.blocks.0.", "image_encoder.blocks.1.": "image_encoder.blocks.2."}

    def in_full(key: str) -> str:
        for ours, theirs in renamed.items():
            if key.startswith(ours):
                return theirs + key[len(ours):]
        return key

    assert {in_full(k): v for k, v in reduced.items()} == {k: v for k, v in full.items()
                                                           if not k.startswith("image_encoder.blocks.")
                                                           or k.split(".")[2] in ("0", "2")}


def test_both_triton_attention_paths_take_its_blocks(triton_interpreted):
    """The windowed block forms the rel-pos bias in the kernel (relpos_attention_from_tables), the global
    block runs the kernel on materialized rel_h / rel_w (relpos_attention): head dim 64 fits both."""
    from samfast import kernels
    from samfast.kernels.relpos_attention import SUPPORTED_HEAD_DIMS, _unsupported_reason

    model = _meta(MODEL)
    cfg = model_config(MODEL)
    assert cfg.head_dim in SUPPORTED_HEAD_DIMS
    paths = []
    for block in model.image_encoder.blocks:
        grid = block.window_size or 64
        qkv = torch.empty(3, 1, cfg.num_heads, grid * grid, cfg.head_dim)
        tables = (torch.empty(resized_rel_pos(block.attn.rel_pos_h, 2 * grid - 1).shape),
                  torch.empty(resized_rel_pos(block.attn.rel_pos_w, 2 * grid - 1).shape))
        rel = (torch.empty(1, cfg.num_heads, grid * grid, grid),) * 2
        assert _unsupported_reason(qkv, *rel) is None
        paths.append("from tables" if kernels.forms_bias_from_tables(qkv, *tables) else "materialized bias")
    assert paths == ["from tables", "materialized bias"]


def test_seeded_weights_are_read_back_as_the_reduced_model_and_vit_b_stays_vit_b():
    from samfast.sam1.checkpoint import infer_model_type

    assert infer_model_type(samfast.synthetic_state_dict(MODEL, seed=0)) == (MODEL, 768, 2)
    full = dict.fromkeys(_meta(FULL).state_dict(), torch.empty(0))  # infer_model_type reads the keys and one shape
    full["image_encoder.patch_embed.proj.weight"] = torch.empty(768, 3, 16, 16)
    assert infer_model_type(full) == (FULL, 768, 12)


def test_gpu_layers_build_the_reduced_model_once_and_perf_keeps_full_depth():
    """tests/gpu/test_stages_gpu.py and test_syncs_gpu.py name one key (one build and one xdist group per
    stage); the perf budgets hold full-depth models only."""
    from parity.checks import budgets
    from parity.gate.models import xdist_group

    stages, syncs, amg = (_load(GPU_TESTS / f"{name}.py") for name in ("test_stages_gpu", "test_syncs_gpu", "test_amg_gpu"))
    assert stages.MODEL == syncs.SHARED["model"] == amg.MODEL == MODEL
    assert (stages.STATIC_BATCH, stages.COMPILE_MODE) == (syncs.SHARED["batch"], syncs.SHARED["compile_mode"])
    for stage in ("nt", "int8", "fp8"):
        assert xdist_group(stages.MODEL, stage, batch=stages.STATIC_BATCH, compile_mode=stages.COMPILE_MODE) == \
            xdist_group(stages=stage, **syncs.SHARED)
    perf_models = {key[1] for key in budgets.load_budgets()}
    assert MODEL not in budgets.MODELS and MODEL not in perf_models
    assert {"vit_b", "vit_h"} <= perf_models


def _load(path: Path):
    name = f"_reduced_model_check_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


# ---------------------------------------------------------------- fp32 against the reference, planted defects


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def cases(image) -> list[dict]:
    return prompt_cases(*image.shape[:2])[::2]  # a point, two points with a background click, a box


def _answers(predictor, image, cases, **kwargs) -> tuple[torch.Tensor, list]:
    predictor.set_image(image)
    return predictor.features.float().clone(), [predictor.predict(**case, **kwargs) for case in cases]


def _stage_outputs(features, answers) -> dict[str, torch.Tensor]:
    """What the GPU stage test compares (tests/stage_accuracy.py): embeddings, low-res logits, IoUs."""
    return {
        "embeddings": features,
        "low_res_logits": torch.cat([torch.as_tensor(a[2]) for a in answers]),
        "iou": torch.cat([torch.as_tensor(a[1]) for a in answers]),
    }


@pytest.fixture(scope="module")
def reference_answers(image, cases):
    from segment_anything import SamPredictor as ReferencePredictor

    ref = reference_sam(MODEL, samfast.synthetic_state_dict(MODEL, seed=0))
    return _answers(ReferencePredictor(ref), image, cases, return_logits=True)


@pytest.mark.slow
def test_equals_reference_in_fp32(image, cases, reference_answers):
    features, answers = _answers(samfast.SamPredictor(samfast.build_sam(MODEL, device="cpu")), image, cases)
    ref_features, ref_answers = reference_answers
    torch.testing.assert_close(features, ref_features, rtol=0, atol=LOGITS_ATOL)
    for ours, ref in zip(answers, ref_answers):
        assert_same_outputs(ours, ref)
    assert_close_to_fp32("fp32", _stage_outputs(features, answers), _stage_outputs(*reference_answers))


@pytest.mark.slow
def test_planted_global_block_defect_fails_the_stage_check(image, cases, reference_answers):
    """The CPU twin of tests/gpu/test_stages_gpu.py::test_planted_global_block_defect_fails_the_stage_check:
    the global block forgets its rel-pos bias, the windowed block is untouched, and the stage rule at fp32's
    threshold fails against the reference."""
    clean = samfast.build_sam(MODEL, device="cpu")
    planted = relpos_bias_scaled_in_global_blocks(samfast.build_sam(MODEL, device="cpu"), 0.0)
    changed = {k for k, v in planted.state_dict().items() if not torch.equal(v, clean.state_dict()[k])}
    assert changed == {"image_encoder.blocks.1.attn.rel_pos_h", "image_encoder.blocks.1.attn.rel_pos_w"}
    outputs = _stage_outputs(*_answers(samfast.SamPredictor(planted), image, cases))
    with pytest.raises(AssertionError, match="exceeds max_logits_rel_l2"):
        assert_close_to_fp32("fp32", outputs, _stage_outputs(*reference_answers))


def test_planted_item_sync_sits_in_the_global_block_alone(monkeypatch):
    """The CPU half of tests/gpu/test_syncs_gpu.py::test_planted_item_sync_in_the_global_block_is_found
    (the GPU half is the profiler seeing the sync): the planted .item() runs once per pass, from the
    global block's attention, and nowhere else."""
    model = item_sync_in_global_attention(samfast.build_sam(MODEL, device="cpu"))
    assert [i for i, block in enumerate(model.image_encoder.blocks) if "forward" in vars(block.attn)] == [1]
    assert global_blocks(model) == [model.image_encoder.blocks[1]]
    callers = []
    item = torch.Tensor.item

    def recording_item(self):
        callers.append(sys._getframe(1).f_code.co_name)
        return item(self)

    monkeypatch.setattr(torch.Tensor, "item", recording_item)
    x = torch.randn(1, 28, 28, model_config(MODEL).embed_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for block in model.image_encoder.blocks:  # 2 x 2 windows, then global attention over 28 x 28 tokens
            x = block(x)
    assert callers == ["global_attention_with_item"]
