"""Every ladder stage runs its timed region (encoder + prompts + decoder) without a host-device sync.

The stages come from the session's model cache, shared with tests/gpu/test_stages_gpu.py (same
key: vit_b_2block, batch 2, compile mode `default`): a sync is a property of the graph and its host
code, which max-autotune does not change, and the cache's warm-up has compiled the model before the
profiled region, as a real timed region is reached. vit_b_2block (samfast/sam1/config.py) has vit_b's
widths and one windowed and one global block: every code path, not the depth. The planted defects
build their own model; one sits in the global block alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import samfast
from parity.checks.syncs import assert_no_syncs, find_syncs, profile_region
from parity.gate.models import xdist_group
from samfast import Prompts
from samfast.stages import FP8, LADDER, SPARSE_WITHOUT_INT8
from tests.planted import item_sync_in_decoder, item_sync_in_global_attention

pytestmark = pytest.mark.gpu

# The ladder's own `sparse` (int8 + 2:4) is refused by torchao 0.18: 2:4 is checked without int8.
STAGES = [*LADDER[:-1], SPARSE_WITHOUT_INT8, FP8]


def _batch(n_images: int = 2):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(n_images)]
    prompts = [Prompts(point_coords=rng.uniform(0, 470, (k, 1, 2)), point_labels=np.ones((k, 1))) for k in (3, 5)][:n_images]
    return images, prompts


# test_stages_gpu's key (its MODEL, STATIC_BATCH, COMPILE_MODE): one build serves both files
SHARED = {"model": "vit_b_2block", "batch": 2, "compile_mode": "default"}


@pytest.mark.parametrize("stage", [pytest.param(s, marks=pytest.mark.xdist_group(xdist_group(stages=s, **SHARED)))
                                   for s in STAGES])
def test_stage_is_sync_free(stage, tmp_path, model_cache):
    model = model_cache.get(stages=stage, device="cuda", **SHARED)
    predictor = samfast.SamPredictor(model)
    images, prompts = _batch()
    trace = profile_region(lambda: predictor.predict_batch(images, prompts), trace_path=tmp_path / f"{stage}.json.gz")
    assert_no_syncs(trace)


def test_planted_item_sync_is_found(tmp_path):
    """Planted defect: an .item() inside the decoder's forward must show up with its frame."""
    model = item_sync_in_decoder(samfast.build_sam(SHARED["model"], device="cuda", stages="bf16"))
    predictor = samfast.SamPredictor(model)
    images, prompts = _batch()
    trace = profile_region(lambda: predictor.predict_batch(images, prompts), trace_path=tmp_path / "planted.json.gz")
    syncs = find_syncs(trace)
    assert syncs and any("forward_with_item" in (s["python_frame"] or "") for s in syncs)
    with pytest.raises(AssertionError, match="cudaStreamSynchronize"):
        assert_no_syncs(trace)


def test_planted_item_sync_in_the_global_block_is_found(tmp_path):
    """Planted defect in the reduced model's one global block alone (the windowed block is clean): an .item()
    in its attention's forward must show up with its frame (its CPU twin: tests/unit/test_reduced_model.py)."""
    model = item_sync_in_global_attention(samfast.build_sam(SHARED["model"], device="cuda", stages="bf16"))
    predictor = samfast.SamPredictor(model)
    images, prompts = _batch()
    trace = profile_region(lambda: predictor.predict_batch(images, prompts), trace_path=tmp_path / "global.json.gz")
    syncs = find_syncs(trace)
    assert syncs and any("global_attention_with_item" in (s["python_frame"] or "") for s in syncs), syncs
    with pytest.raises(AssertionError, match="cudaStreamSynchronize"):
        assert_no_syncs(trace)
