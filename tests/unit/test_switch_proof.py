"""Every switch proves it ran (parity.checks.switch_proofs): planted defects, one per switch.

Each switch is undone on the built model (or skips one module) the way a careless edit of samfast/stages.py
would; the stage must come out NOT EXERCISED with a sentence naming what stayed behind. The built model's
state is enough for most proofs, so most tests run nothing; nt's runs the prompt decoder alone (the encoder
replaced by zeros). Switches that need CUDA to build (fp8, sparse) are proven on a dense fixture here and
for real on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import samfast
from parity.checks.exercised import watch_switches
from parity.checks.switch_proofs import PROOFS, RunTrace
from samfast import build, stages
from samfast.stages import SWITCHES, parse_stages


def _stage(stage: str, run=None, ignored=None):
    """Build vit_tiny at `stage` inside watch_switches, run `run(model)` if given; the SwitchUse."""
    with watch_switches(parse_stages(stage), ignored or {}) as used:
        model = used.watch(samfast.build_sam("vit_tiny", device="cpu", stages=stage))
        if run:
            run(model)
    return used


def _undo_after_build(monkeypatch, undo) -> None:
    """The switch patched to leave something behind: apply_stages as usual, then `undo(model)`."""
    apply = build.apply_stages

    def careless(model, switches):
        apply(model, switches)
        undo(model)

    monkeypatch.setattr(build, "apply_stages", careless)


def _decode_two_images(model) -> None:
    """predict_batch over two tiny images, the encoder replaced by zeros: only the decoder's calls matter."""
    model.embed_images = lambda images: torch.zeros(len(images), 256, 64, 64, dtype=model.dtype)
    image = np.zeros((32, 48, 3), dtype=np.uint8)
    prompts = samfast.Prompts(point_coords=np.array([[[10.0, 20.0]]]), point_labels=np.ones((1, 1)))
    samfast.SamPredictor(model).predict_batch([image, image], [prompts, prompts])


def test_every_switch_has_a_proof():
    """The contract for a new switch (SAM 2's included): not done until it has its proof here."""
    assert set(PROOFS) == set(SWITCHES) - {"fp32"}


def test_sdpa_left_on_the_math_path_is_not_exercised_naming_the_modules(monkeypatch):
    _undo_after_build(monkeypatch, lambda model: [setattr(m, "attn_impl", "math") for m in model.attention_modules().values()])
    used = _stage("fp32+sdpa")
    (sentence,) = used.not_exercised
    assert sentence.startswith("sdpa: 11 of 11 attention modules stayed on the math path: image_encoder.blocks.0.attn, ")


def test_sdpa_skipping_one_decoder_module_names_it(monkeypatch):
    _undo_after_build(monkeypatch, lambda model: setattr(model.mask_decoder.transformer.layers[1].self_attn, "attn_impl", "math"))
    (sentence,) = _stage("fp32+sdpa").not_exercised
    assert sentence == "sdpa: 1 of 11 attention modules stayed on the math path: mask_decoder.transformer.layers.1.self_attn"


def test_sdpa_set_but_never_called_is_not_exercised():
    (sentence,) = _stage("fp32+sdpa").not_exercised  # built, never run
    assert "F.scaled_dot_product_attention never ran" in sentence


def test_sdpa_that_ran_is_exercised():
    used = _stage("fp32+sdpa", run=_decode_two_images)  # the decoder's attentions call SDPA
    assert used.not_exercised == [] and used.exercised[0].startswith("sdpa: 11 attention modules on the SDPA path")


def test_nt_decoding_image_by_image_is_not_exercised(monkeypatch):
    """A reviewer's trick: the predictor decodes per image whatever the switches say."""
    _undo_after_build(monkeypatch, lambda model: setattr(model, "switches", model.switches - {"nt"}))
    (sentence,) = _stage("fp32+nt", run=_decode_two_images).not_exercised
    assert sentence == "nt: 2 of 2 prompt-decoder calls decoded one image's prompts, not a batch's nested prompts"


def test_nt_that_ran_is_exercised_and_not_applicable_where_the_task_ignores_it():
    used = _stage("fp32+nt", run=_decode_two_images)
    assert used.exercised == ["nt: 1 prompt-decoder call(s), each with the nested prompts of a whole batch"]
    ignored = _stage("fp32+nt", ignored={"nt": "the generator decodes one image at a time"})  # never run: no proof asked
    assert ignored.not_exercised == ignored.exercised == []
    assert ignored.not_applicable == {"nt": "the generator decodes one image at a time"}


def test_bf16_leaving_one_module_in_fp32_names_its_parameters(monkeypatch):
    _undo_after_build(monkeypatch, lambda model: model.image_encoder.blocks[2].mlp.lin2.float())
    (sentence,) = _stage("bf16").not_exercised
    assert sentence == ("bf16: 2 of 201 parameters stayed torch.float32: image_encoder.blocks.2.mlp.lin2.weight, "
                        "image_encoder.blocks.2.mlp.lin2.bias")


def test_bf16_activations_leaving_a_block_in_fp32_name_the_block():
    model = samfast.build_sam("vit_tiny", device="cpu", stages="bf16")
    trace = RunTrace(block_dtypes={**{name: torch.bfloat16 for name in model.encoder_blocks()},
                                   "image_encoder.blocks.3": torch.float32})
    ran, sentence = PROOFS["bf16"](model, trace, frozenset({"bf16"}))
    assert not ran and sentence == "bf16: 1 of 4 encoder blocks gave no bf16 activations: image_encoder.blocks.3 (torch.float32)"


def test_int8_skipping_one_linear_names_it(monkeypatch):
    quantize = stages.quantize_linears
    monkeypatch.setattr(stages, "quantize_linears", lambda encoder, linears, **switch: quantize(
        encoder, {n: m for n, m in linears.items() if n != "image_encoder.blocks.1.attn.proj"}, **switch))
    (sentence,) = _stage("fp32+int8").not_exercised
    assert sentence == "int8: 1 of 16 encoder linears stayed without int8 (torchao) weights: image_encoder.blocks.1.attn.proj"


def test_int8_whose_modules_never_ran_is_not_exercised():
    (sentence,) = _stage("fp32+int8").not_exercised  # quantized, never run
    assert sentence.startswith("int8: the modules holding the int8 (torchao) weights never ran: image_encoder.blocks.0.attn, ")


@pytest.mark.parametrize("switch,what", [("fp8", "fp8 e4m3 (torchao)"), ("sparse", "2:4 semi-structured")])
def test_linears_left_dense_are_not_exercised(switch, what):
    """fp8 and sparse build on a CUDA GPU only: the proof on the state a do-nothing switch leaves (dense weights)."""
    model = samfast.build_sam("vit_tiny", device="cpu")
    ran, sentence = PROOFS[switch](model, RunTrace(), frozenset({switch}))
    assert not ran and sentence.startswith(f"{switch}: 16 of 16 encoder linears stayed without {what} weights: "
                                           "image_encoder.blocks.0.attn.qkv, ")


def test_triton_switch_that_did_nothing_names_the_modules(monkeypatch, triton_interpreted):
    """No kernel call, so no fallback to count: only the model shows the switch did nothing."""
    def undo(model):
        for module in model.triton_attention_modules().values():
            module.attn_impl = "math"
        model.mask_decoder.upscale_impl = "conv"

    _undo_after_build(monkeypatch, undo)
    (sentence,) = _stage("fp32+triton").not_exercised
    assert sentence == ("triton: 5 module(s) stayed off the Triton kernels: image_encoder.blocks.0.attn, "
                        "image_encoder.blocks.1.attn, image_encoder.blocks.2.attn, image_encoder.blocks.3.attn and 1 more")


@pytest.mark.gpu
@pytest.mark.parametrize("stage", ["bf16+sdpa", "bf16+int8", "bf16+fp8", "bf16+sparse", "nt"])
def test_each_switch_is_exercised_on_the_gpu(stage, monkeypatch):
    """The real runs: every switch of the stage proven (bf16 blocks, quantized or 2:4 weights, compiled graphs).
    Compiled in mode default: the proof is the graphs, not the kernels max-autotune picks (whose search took
    this test to 174 s, 115 s of it compiling, in the cold H100 gate at aee4601)."""
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")
    with watch_switches(parse_stages(stage)) as used:
        model = used.watch(samfast.build_sam("vit_tiny", device="cuda", stages=stage))
        image = np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8)
        prompts = samfast.Prompts(point_coords=np.array([[[10.0, 20.0]], [[150.0, 90.0]]]), point_labels=np.ones((2, 1)))
        samfast.SamPredictor(model).predict_batch([image, image], [prompts, prompts])
    assert used.not_exercised == [] and len(used.exercised) == len(parse_stages(stage))


def test_sdpa_proof_covers_sam2s_memory_cross_attentions(monkeypatch):
    """SAM 2's sdpa switch also splits the memory cross-attentions by memory frame (video tracking): one
    left whole is named; with every one split, the proof counts them."""
    from samfast import build

    switches = parse_stages("fp32+sdpa")
    ran = RunTrace(sdpa={"called": True})
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32+sdpa")
    proven, sentence = PROOFS["sdpa"](model, ran, switches)
    assert proven and f", {len(model.memory_cross_attentions())} memory cross-attentions split by memory frame;" in sentence

    apply = build.apply_stages
    monkeypatch.setattr(build, "apply_stages", lambda model, switches: apply(model, switches) or setattr(
        model.memory_attention.layers[1].cross_attn_image, "split_by_memory_frame", False))
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32+sdpa")
    proven, sentence = PROOFS["sdpa"](model, ran, switches)
    assert not proven
    assert sentence.endswith("memory cross-attentions not split by memory frame: memory_attention.layers.1.cross_attn_image")
