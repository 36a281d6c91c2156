"""SAM 3's switches (bf16, sdpa, compile): each stage within its precision's limits of fp32, each switch
proven by what it left behind, bf16's host syncs fixed, and the compiled model never recompiling across
images, phrases and exemplar boxes. On the reduced model with seeded weights, on the CPU.

fp32 is the trusted path: attention written out ("math"), itself equal to sam3 0.1.4
(test_sam3_image_model.py). A stage is compared with it on forward_grounding's mask logits, boxes and
scores, at the limits of parity/budgets.toml's [accuracy.<precision>] (tests/stage_accuracy.py's rule).
Planted defects: a block left in fp32, an attention left on the math path, an extra host sync.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("open_clip", reason="SAM 3's tokenizer needs open_clip_torch")

import samfast  # noqa: E402
from parity.checks import compile as compile_check  # noqa: E402
from parity.checks.exercised import watch_switches  # noqa: E402
from parity.compare.gates import load_thresholds, thresholds_for  # noqa: E402
from samfast.sam3 import Sam3Processor  # noqa: E402
from samfast.sam3.config import SAM3_REDUCED  # noqa: E402
from samfast.sam3.image_model import FindInput, detection_scores  # noqa: E402
from samfast.errors import StageError  # noqa: E402
from samfast.stages import parse_stages  # noqa: E402
from tests.compile_backends import aot_eager_and_inductor  # noqa: E402
from tests.stage_accuracy import rel_l2  # noqa: E402

PHRASES = ["a red circle", "blue squares"]
SIZES = [(150, 90), (64, 80), (112, 112)]  # (width, height)


def build(stages: str):
    return samfast.build_sam("sam3_reduced", seed=0, device="cpu", stages=stages)


@pytest.fixture(scope="module")
def fp32_model():
    return build("fp32")


def grounding(model, boxes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """forward_grounding on 2 images x 2 phrases, `boxes` random exemplar boxes per prompt: its mask logits,
    boxes and scores in float32."""
    gen, device = torch.Generator().manual_seed(seed), model.device
    images = torch.rand(2, 3, SAM3_REDUCED.image_size, SAM3_REDUCED.image_size, generator=gen) * 2 - 1
    with torch.inference_mode():
        backbone_out = model.backbone.forward_image(images.to(device))
        backbone_out.update(model.backbone.forward_text(PHRASES))
        find_input = FindInput(img_ids=torch.tensor([0, 0, 1, 1], device=device),
                               text_ids=torch.tensor([0, 1, 0, 1], device=device))
        prompt = model.empty_prompt(4)
        if boxes:
            centres, sizes = torch.rand(boxes, 4, 2, generator=gen) * 0.5 + 0.25, torch.rand(boxes, 4, 2, generator=gen) * 0.3 + 0.1
            prompt.append_boxes(torch.cat([centres, sizes], dim=-1).to(device),
                                torch.ones(boxes, 4, dtype=torch.bool, device=device))
        out = model.forward_grounding(backbone_out=backbone_out, find_input=find_input, geometric_prompt=prompt)
        return {"masks": out["pred_masks"].float(), "boxes": out["pred_boxes"].float(), "scores": detection_scores(out)}


def assert_within_limits(stages: str, got: dict, fp32: dict) -> None:
    limits = thresholds_for(stages, load_thresholds())
    errors = {k: rel_l2(got[k], fp32[k]) for k in ("masks", "boxes")}
    score_err = (got["scores"] - fp32["scores"]).abs().max().item()
    assert all(np.isfinite(list(errors.values()))), errors
    assert max(errors.values()) <= limits["max_logits_rel_l2"], (
        f"{stages}: relative L2 vs fp32 {errors} over max_logits_rel_l2 {limits['max_logits_rel_l2']}")
    assert score_err <= limits["max_score_abs_err"], (
        f"{stages}: scores off by {score_err:.3g} > max_score_abs_err {limits['max_score_abs_err']}")


@pytest.mark.parametrize("boxes", [0, 2])
@pytest.mark.parametrize("stages", ["fp32+sdpa", "bf16", "bf16+sdpa", "bf16+sdpa+int8"])
def test_stage_is_within_its_limits_of_fp32(fp32_model, stages, boxes):
    assert_within_limits(stages, grounding(build(stages), boxes), grounding(fp32_model, boxes))


def test_fp32_takes_the_math_path_and_the_accuracy_check_sees_a_perturbed_weight(fp32_model):
    assert {m.attn_impl for m in fp32_model.attention_modules().values()} == {"math"}
    fp32 = grounding(fp32_model, 2)
    perturbed = build("fp32+sdpa")
    with torch.no_grad():
        perturbed.transformer.decoder.layers[0].linear1.weight.mul_(1.05)  # planted: 5% on one layer
    with pytest.raises(AssertionError, match="relative L2|scores off"):
        assert_within_limits("fp32+sdpa", grounding(perturbed, 2), fp32)


def proofs(model, stages: str) -> tuple[list[str], list[str]]:
    """What each switch of `stages` left behind on `model` after one grounding call."""
    with watch_switches(parse_stages(stages)) as use:
        grounding(use.watch(model), 1)
    return use.exercised, use.not_exercised


def test_each_switch_proves_it_ran():
    exercised, not_exercised = proofs(build("bf16+sdpa"), "bf16+sdpa")
    assert not_exercised == [] and len(exercised) == 2, (exercised, not_exercised)
    assert "encoder blocks" in exercised[0] and "F.scaled_dot_product_attention ran" in exercised[1]


def test_int8_quantizes_every_vit_linear_and_proves_it_ran():
    """The int8 switch on SAM 3: torchao's int8 weights in each of the ViT blocks' linears (qkv, proj and the
    MLP's two), the text encoder and the detector left as they are; fp8 needs a GPU and says so."""
    model = build("bf16+sdpa+int8")
    exercised, not_exercised = proofs(model, "bf16+sdpa+int8")
    blocks = len(model.image_encoder.trunk.blocks)
    assert not_exercised == [] and f"{4 * blocks} encoder linears hold int8 (torchao) weights" in exercised[-1], exercised
    assert model.backbone.language_backbone.encoder.transformer.resblocks[0].mlp.c_fc.weight.dtype == torch.bfloat16
    with pytest.raises(StageError, match="fp8 needs a CUDA GPU"):
        build("bf16+sdpa+fp8")


def test_the_proofs_find_a_switch_left_behind():
    model = build("bf16+sdpa")
    model.image_encoder.trunk.blocks[0].float()  # planted: one ViT block stayed fp32
    model.transformer.decoder.layers[1].ca_text.attn_impl = "math"  # planted: one attention stayed math
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the fp32 block between bf16 ones still runs
        _, not_exercised = proofs(model, "bf16+sdpa")
    assert len(not_exercised) == 2, not_exercised
    assert "stayed torch.float32" in not_exercised[0] and "trunk.blocks.0" in not_exercised[0]
    assert "on the math path: transformer.decoder.layers.1.ca_text" in not_exercised[1]


def pil_images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in SIZES]


def processor(model, threshold: float = 0.3) -> Sam3Processor:
    return Sam3Processor(model, resolution=SAM3_REDUCED.image_size, confidence_threshold=threshold)


def test_bf16_makes_one_host_sync_per_pair_and_a_planted_one_is_seen(monkeypatch):
    pytest.importorskip("tests.sam3_reference", reason="the host-sync recorder's module needs sam3==0.1.4")
    from tests.unit.test_sam3_geometry_and_masks import HostSyncs

    model = build("bf16+sdpa")
    fast = processor(model)
    with HostSyncs() as syncs:
        fast.predict_batch(pil_images(), PHRASES)
    assert syncs.found == ["nonzero"] * (len(SIZES) * len(PHRASES))
    decode = model.segmentation_head.forward

    def with_a_read_back(*args, **kwargs):
        out = decode(*args, **kwargs)
        bool(out["pred_masks"].amax() > 0)  # planted: the host waits for the masks
        return out

    monkeypatch.setattr(model.segmentation_head, "forward", with_a_read_back)
    with HostSyncs() as syncs:
        fast.predict_batch(pil_images(), PHRASES)
    assert syncs.found == ["is_nonzero"] + ["nonzero"] * (len(SIZES) * len(PHRASES))


# aot_eager: the graphs and guards are dynamo's and AOTAutograd's, the padding's effect the traced graphs';
# inductor adds its C++ code (148 s on 2 cores cold), which the GPU runners check
@pytest.mark.parametrize("compile_backend", aot_eager_and_inductor(
    inductor_slow="compiles the reduced model's four graphs on the CPU",
    gpu_runner="inductor's C++ compile of the reduced model's four graphs, 148 s on 2 cores cold; [aot_eager] "
               "checks the graphs, the guards and the padding in the CPU run"), indirect=True)
def test_compile_never_recompiles_across_images_phrases_and_boxes(fp32_model, compile_backend):
    model = build("fp32+compile+sdpa")
    fast = processor(model)
    images = pil_images()
    with compile_check.watch() as first:
        fast.predict_batch(images[:1], PHRASES[:1])  # the one-prompt graph
        fast.predict_batch(images[:1], PHRASES)  # the prompt batch's
    with compile_check.watch() as seen:
        for n_images, phrases in [(3, PHRASES), (2, [*PHRASES, "x", "a dog", "cats", "red", "blue", "a red car"]),
                                  (1, ["a giraffe", "a zebra", "x"])]:
            fast.predict_batch(images[:n_images], phrases)
        state = fast.set_text_prompt("a red circle", fast.set_image(images[0]))
        for _ in range(4):  # 1 to 4 exemplar boxes
            state = fast.add_geometric_prompt([0.5, 0.5, 0.3, 0.2], True, state)
    assert first.graphs_compiled == 4, "the ViT, the text encoder, forward_grounding on one prompt and on a batch"
    seen.assert_clean()
    assert seen.graphs_compiled == 0
    # the compiled path's padding (images, phrases, prompts to two; boxes to four slots) changes nothing
    assert_within_limits("fp32+compile+sdpa", grounding(model, 2), grounding(fp32_model, 2))
