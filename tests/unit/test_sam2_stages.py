"""SAM 2's switches (sdpa, bf16, nt, int8; compile in tests/system/test_sam2_compile.py) against its fp32 stage,
and each switch's proof (parity.checks.switch_proofs) on a SAM 2 model, with a planted do-nothing defect.

Same seeded sam2.1_hiera_t weights for every stage. The encoder runs on a 256 x 256 input (every Hiera
stage still pads its windows, as in test_sam2_modules) at 1/16 of 1024's CPU time (bf16 matmuls are slow
on the CPU); the decoder on seeded features of the real 64 x 64 shape, three points, three masks.

Tolerances, relative L2 (||x - fp32|| / ||fp32||), measured here and at 1024 x 1024 (/tmp measurement,
the full image path):
- fp32+sdpa: SDPA vs the written-out softmax, both fp32: measured <= 9.5e-7 here (scores 0; at 1024:
  7.4e-7 embeddings, 5.8e-7 logits); asserted 1e-5, fp32 rounding and nothing more.
- bf16: 8 mantissa bits (2^-9 relative per rounding) through 12 Hiera blocks and the decoder: measured
  here 1.2e-2 embedding, 6.1e-3 / 9.2e-3 high-res features, 1.5e-2 mask logits, 4.1e-3 scores (at 1024:
  1.2e-2, 1.0e-2 logits, 2.1e-3 scores). Asserted 2.5e-2, ~1.7x the largest: a real error (a wrong
  scale, a dropped residual, fp16 overflow) gives O(1).
- int8 (torchao's dynamic int8 on Hiera's 51 linears; the decoder is not quantized): measured here
  2.9e-2 embedding, 1.1e-2 / 2.1e-2 high-res features, with bf16 1.5e-2 mask logits, 4.1e-3 scores
  (fp32+int8: 2.9e-2 / 9.2e-3 / 1.9e-2). Asserted 6e-2, ~2x the largest. fp8 needs a GPU of compute
  capability 8.9: tests/gpu/test_sam2_gpu.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import samfast
from parity.checks.exercised import watch_switches
from parity.checks.switch_proofs import PROOFS, RunTrace
from samfast.errors import StageError
from samfast.families import family_of
from samfast import build
from samfast.modeling.sam2_prompting.mask_decoder import Sam2MaskDecoder
from samfast.sam2.config import sam2_config
from samfast.sam2.sam2_base import build_sam2_modules
from samfast.stages import apply_stages, parse_stages

MODEL_TYPE = "sam2.1_hiera_t"
SIZE = 256
HIERA_T_ATTENTIONS = 12 + 7  # 12 Hiera blocks; the decoder's 2 x 3 two-way attentions and its final one
SDPA_TOL = 1e-5
BF16_TOL = 2.5e-2
INT8_TOL = 6e-2
HIERA_T_LINEARS = 12 * 4 + 3  # qkv, proj and the MLP's two per block; the 3 stage transitions' width-doubling proj


def _features(seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 256, 64, 64, generator=g) * 3,
            [torch.randn(1, 32, 256, 256, generator=g), torch.randn(1, 64, 128, 128, generator=g)])


def _run(model, encoder: bool = True) -> dict[str, torch.Tensor]:
    """The encoder's outputs at SIZE (if asked) and the decoder's masks and scores on seeded features, as fp32."""
    out = {}
    with torch.no_grad():
        if encoder:
            image = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
            embedding, (s0, s1) = model.image_features(image)
            out.update(embedding=embedding, feat_s0=s0, feat_s1=s1)
        embedding, high_res = _features()
        points = torch.tensor([[[300.0, 400.0], [600.0, 500.0], [100.0, 900.0]]])
        sparse, dense = model.sam_prompt_encoder(points=(points, torch.tensor([[1, 0, 1]])), boxes=None, masks=None)
        dtype = model.dtype
        masks, scores, _, _ = model.sam_mask_decoder(
            embedding.to(dtype), model.sam_prompt_encoder.get_dense_pe(), sparse, dense, True, True,
            [f.to(dtype) for f in high_res])
    return {**out, "masks": masks, "scores": scores}


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _build(stage: str):
    return samfast.build_sam(MODEL_TYPE, device="cpu", stages=stage)


@pytest.fixture(scope="module")
def fp32():
    return _run(_build("fp32"))


@pytest.fixture(scope="module")
def bf16_run():
    """bf16 built and run inside the switch watcher: (outputs, what the proofs found)."""
    with watch_switches(parse_stages("bf16")) as used:
        outputs = _run(used.watch(_build("bf16")))
    return outputs, used


@pytest.mark.parametrize("stage,unbuilt,instead", [
    ("sparse", "sparse", "bf16+compile+sdpa+triton+nt+int8"), ("bf16+sparse", "sparse", "fp32+bf16"),
    ("fp32+int8+sparse", "sparse", "fp32+int8")])
def test_unbuilt_switches_are_refused_by_name_with_the_stage_to_use(stage, unbuilt, instead):
    """The error names the built part of the stage, in '+' form (one switch as 'fp32+' it)."""
    with pytest.raises(StageError, match=f"the {unbuilt} switch\\(es\\) are not built for SAM 2 yet.*use '{re.escape(instead)}' "):
        _build(stage)
    assert parse_stages(instead) == parse_stages(stage) & family_of(MODEL_TYPE).built_switches


@pytest.mark.parametrize("stage", ["fp32", "fp32+sdpa", "bf16", "compile", "sdpa", "bf16+sdpa", "fp32+compile"])
def test_lossless_stages_build(stage):
    assert _build(stage).switches == parse_stages(stage)


def test_sdpa_equals_fp32_to_fp32_rounding(fp32):
    got = _run(_build("fp32+sdpa"))
    for name, ref in fp32.items():
        assert got[name].dtype == torch.float32 and _rel_l2(got[name], ref) < SDPA_TOL, name


def test_bf16_is_within_bf16_rounding_of_fp32(fp32, bf16_run):
    got, _ = bf16_run
    for name, ref in fp32.items():
        assert got[name].dtype == torch.bfloat16 and _rel_l2(got[name], ref) < BF16_TOL, name


@pytest.mark.parametrize("stage", ["fp32+int8", "bf16+sdpa+int8"])
def test_int8_is_within_int8_rounding_of_fp32(fp32, stage):
    got = _run(_build(stage))
    for name, ref in fp32.items():
        assert _rel_l2(got[name], ref) < INT8_TOL, name


@pytest.mark.parametrize("stage,as_gemm", [("fp32", False), ("bf16", False), ("fp32+compile", True), ("compile", True)])
def test_compile_runs_hieras_patch_conv_as_a_gemm(stage, as_gemm):
    """SAM 1's rule on Hiera's 7x7 stride-4 patch conv (PatchEmbed.as_gemm; its equality with the conv:
    tests/unit/test_hiera_compile_rewrites.py)."""
    assert _build(stage).patch_embedding().as_gemm is as_gemm


@pytest.mark.parametrize("stage,gelu_impl", [("fp32", "module"), ("bf16", "module"), ("compile", "epilogue"),
                                             ("fp32+compile", "module"), ("bf16+compile+sdpa+int8", "module")])
def test_each_stage_picks_its_hiera_mlp_gelu_path(stage, gelu_impl):
    """SAM 1's rule on Hiera's MLPs: lin1 and its tanh GELU as one GEMM only on a plain bf16 compiled encoder
    (within bf16's rounding, not fp32's; a quantized lin1 has no plain weight for the fused GEMM)."""
    model = _build(stage)
    assert {mlp.gelu_impl for mlp in model.encoder_mlps()} == {gelu_impl}
    assert len(model.encoder_mlps()) == 12


def test_fp8_on_the_cpu_is_refused_with_what_it_needs():
    with pytest.raises(StageError, match=r"fp8 needs a CUDA GPU with fp8 tensor cores; the model is on cpu: run the fp8 "
                                         r"stage on a CUDA GPU of compute capability >= 8.9"):
        _build("bf16+sdpa+fp8")


# --- each switch proven on the SAM 2 model, and a planted do-nothing switch caught ---------------------
def _undo_after_build(monkeypatch, undo) -> None:
    """The switch patched to leave something behind on the SAM 2 model: apply_stages, then `undo(model)`."""
    apply = build.apply_stages

    def careless(model, switches):
        apply(model, switches)
        undo(model)

    monkeypatch.setattr(build, "apply_stages", careless)


def _watched(stage: str, encoder: bool = False):
    with watch_switches(parse_stages(stage)) as used:
        _run(used.watch(_build(stage)), encoder=encoder)
    return used


def test_sdpa_is_exercised_on_sam2():
    assert _watched("fp32+sdpa").exercised == [
        f"sdpa: {HIERA_T_ATTENTIONS} attention modules on the SDPA path, 4 memory cross-attentions split by memory "
        "frame; F.scaled_dot_product_attention ran"]


def test_sdpa_left_on_the_math_path_is_not_exercised(monkeypatch):
    _undo_after_build(monkeypatch, lambda model: [setattr(m, "attn_impl", "math") for m in model.attention_modules().values()])
    (sentence,) = _watched("fp32+sdpa").not_exercised
    assert sentence.startswith(f"sdpa: {HIERA_T_ATTENTIONS} of {HIERA_T_ATTENTIONS} attention modules stayed on the "
                               "math path: image_encoder.trunk.blocks.0.attn, ")


def test_bf16_is_exercised_on_sam2(bf16_run):
    _, used = bf16_run
    assert used.not_exercised == [] and used.exercised[0].endswith("the activations leaving 12 encoder blocks in bf16")


def test_bf16_leaving_a_hiera_block_in_fp32_names_it(monkeypatch):
    _undo_after_build(monkeypatch, lambda model: model.image_encoder.trunk.blocks[3].float())
    (sentence,) = _watched("bf16").not_exercised
    assert sentence.startswith("bf16: 14 of 470 parameters stayed torch.float32: image_encoder.trunk.blocks.3.norm1.weight, ")


def test_int8_is_exercised_on_sam2():
    assert _watched("fp32+int8", encoder=True).exercised == [
        f"int8: {HIERA_T_LINEARS} encoder linears hold int8 (torchao) weights, and their modules ran"]


def test_int8_whose_hiera_modules_never_ran_is_not_exercised():
    """Planted: quantized, the encoder never run. The modules watched are the MLPs themselves, not their
    `layers` ModuleList (which has no forward, so it never "runs" even when the MLP does)."""
    (sentence,) = _watched("fp32+int8", encoder=False).not_exercised
    assert sentence == ("int8: the modules holding the int8 (torchao) weights never ran: image_encoder.trunk.blocks.0.attn, "
                        "image_encoder.trunk.blocks.0.mlp, image_encoder.trunk.blocks.1.attn, image_encoder.trunk.blocks.1.mlp "
                        "and 23 more")


def test_int8_leaving_a_hiera_linear_unquantized_names_it(monkeypatch):
    def plain_again(model):
        block = model.image_encoder.trunk.blocks[3]
        block.mlp.layers[0] = torch.nn.Linear(block.mlp.layers[0].in_features, block.mlp.layers[0].out_features)

    _undo_after_build(monkeypatch, plain_again)
    (sentence,) = _watched("fp32+int8", encoder=True).not_exercised
    assert sentence == (f"int8: 1 of {HIERA_T_LINEARS} encoder linears stayed without int8 (torchao) weights: "
                        "image_encoder.trunk.blocks.3.mlp.layers.0")


# --- nt: every image's prompts in one decoder call ---------------------------------------------------
NT_MODEL = "sam2.1_hiera_nano"  # the decoder is what nt changes; the nano's encoder keeps the test fast


def _nt_scene():
    from tests.stage_accuracy import random_scene

    return random_scene([(300, 420), (200, 260), (256, 256)], [2, 1, 3])


def _predict_batch(stage: str, monkeypatch=None, per_image: bool = False):
    """(Predictions, SwitchUse) of predict_batch over _nt_scene with `stage` on the seeded nano;
    per_image: the nt path planted to decode image by image (what the proof must catch)."""
    from samfast.sam2.predictor import SamPredictorForSAM2

    if per_image:
        monkeypatch.setattr(SamPredictorForSAM2, "_decode_all_images", lambda self, embed, high_res, prompts, multi: [
            self.image_predictor._decode(*tp, None, multi, embed[j : j + 1], [f[j : j + 1] for f in high_res])
            for j, tp in enumerate(prompts)])
    images, prompts = _nt_scene()
    with watch_switches(parse_stages(stage)) as used:
        model = used.watch(samfast.build_sam(NT_MODEL, device="cpu", stages=stage))
        predictions = samfast.SamPredictor(model).predict_batch(images, prompts)
    return predictions, used


def test_nt_decodes_every_images_prompts_in_one_call_as_one_call_per_image_does():
    plain, _ = _predict_batch("fp32+sdpa")
    nested, used = _predict_batch("fp32+sdpa+nt")
    assert used.exercised[-1] == "nt: 1 prompt-decoder call(s), each with the nested prompts of a whole batch"
    for got, want in zip(nested, plain):
        assert got.masks.shape == want.masks.shape and got.masks.shape[0] > 0
        torch.testing.assert_close(got.low_res_logits, want.low_res_logits, rtol=0, atol=1e-4)
        torch.testing.assert_close(got.iou_predictions, want.iou_predictions, rtol=0, atol=1e-5)
        # a pixel may flip where a logit sits within rounding of the threshold: count, do not demand equality
        assert (got.masks != want.masks).float().mean() < 1e-4


def test_nt_decoding_image_by_image_is_not_exercised(monkeypatch):
    _, used = _predict_batch("fp32+nt", monkeypatch, per_image=True)
    assert used.not_exercised == ["nt: 3 of 3 prompt-decoder calls decoded one image's prompts, not a batch's nested prompts"]


def test_nt_refuses_prompts_of_different_kinds():
    images, _ = _nt_scene()
    predictor = samfast.SamPredictor(samfast.build_sam(NT_MODEL, device="cpu", stages="fp32+nt"))
    with pytest.raises(samfast.InputError, match="nt batching needs the same kind of prompt for every image"):
        predictor.predict_batch(images[:2], [samfast.Prompts(point_coords=np.array([[[10.0, 20.0]]]), point_labels=np.ones((1, 1))),
                                             samfast.Prompts(boxes=np.array([[5.0, 5.0, 50.0, 60.0]]))])


def test_compile_that_compiled_nothing_is_not_exercised(monkeypatch):
    """The switch patched to compile nothing: the run is eager (the compiled run: tests/system/test_sam2_compile.py)."""
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: None)
    monkeypatch.setattr(Sam2MaskDecoder, "compile_for_any_prompt_count", lambda self: None)
    (sentence,) = _watched("fp32+compile").not_exercised
    assert sentence.startswith("torch.compile compiled no graph")


def test_compile_gives_the_encoder_one_batch_size_padded_or_split():
    """build_sam(..., batch_size=2) with compile: 3 images reach the encoder as 2 + 1 padded to 2 (what keeps a
    compiled Hiera from recompiling per batch size), and each image's features are those of an unpadded call.
    The encoder is left eager here (its compile is tests/system/test_sam2_compile.py's); the calls are counted."""
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32", batch_size=2)
    assert model.static_batch is None  # no compile, no padding
    images = torch.randn(3, 3, 1024, 1024, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model.image_features(images)
        model.static_batch, seen = 2, []
        encoder = model.image_encoder
        hook = encoder.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
        padded = model.image_features(images)
        hook.remove()
    assert seen == [2, 2]
    assert torch.equal(plain[0], padded[0]) and all(torch.equal(a, b) for a, b in zip(plain[1], padded[1]))
    built = samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32+compile", batch_size=2)
    assert built.static_batch == 2


# --- triton: Hiera's small windows, the decoder's, the memory keys' and the mask convs' kernels ----------------------
@pytest.mark.parametrize("stage", ["fp32+triton", "fp32+compile+triton"])
def test_triton_puts_the_sam2_decoder_and_hieras_small_windows_on_their_kernels(stage):
    """The upscaling and the cross-attention kernels, eager and compiled (the compiled decoder routes
    prompts of more tokens than the kernels take to a graph of its own: test_compiled_sam2_decoder_*),
    and Hiera's attentions whose windows fit the window kernel (the nano's blocks 1 and 2)."""
    model = samfast.build_sam(NT_MODEL, device="cpu", stages=stage)
    decoder = model.prompt_decoder()
    assert (decoder.upscale_impl, decoder.transformer.fused_cross_attention) == ("triton", True)
    impls = {name: m.attn_impl for name, m in model.attention_modules().items() if ".trunk." in name}
    assert impls == {f"image_encoder.trunk.blocks.{i}.attn": "triton" if i in (1, 2) else "math" for i in range(5)}
    assert {m.key_impl for m in model.memory_cross_attentions().values()} == {"triton"}
    assert model.memory_encoder.mask_downsampler.conv_impl == "triton"


def test_triton_proof_on_hiera_l_names_a_first_norm_left_off_the_bias_channel_kernel():
    """Hiera-L (its modules on the meta device: the switch sets flags, nothing runs): the triton switch puts
    blocks 1-7's first norms on kernels.norm_with_bias_channel; planted: one left behind."""
    with torch.device("meta"):
        model = build_sam2_modules(sam2_config("sam2.1_hiera_l"))
    switches = parse_stages("fp32+sdpa+triton")
    apply_stages(model, switches)
    assert [block.bias_as_channel for block in model.image_encoder.trunk.blocks] == [False] + [True] * 7 + [False] * 40
    ran, sentence = PROOFS["triton"](model, RunTrace(), switches)
    assert ran and sentence.endswith(", 7 blocks' first norms with the bias channel on the Triton kernels; no call fell back")
    model.image_encoder.trunk.blocks[3].bias_as_channel = False
    ran, sentence = PROOFS["triton"](model, RunTrace(), switches)
    assert not ran and sentence == "triton: 1 module(s) stayed off the Triton kernels: image_encoder.trunk.blocks.3 (first norm)"


def test_no_block_takes_the_bias_channel_where_windows_pad_the_maps():
    """hiera_t's 14-windows pad its 64 map: its encoder keeps the map-order forward, which never reads the flag."""
    model = _build("bf16+compile+sdpa+triton")
    assert model.bias_channel_blocks() == {}
    assert not any(block.bias_as_channel for block in model.image_encoder.trunk.blocks)


def test_triton_proof_on_sam2_names_a_decoder_left_off_its_kernels():
    model = samfast.build_sam(NT_MODEL, device="cpu", stages="fp32+compile+triton")
    switches = parse_stages("fp32+compile+triton")
    ran, sentence = PROOFS["triton"](model, RunTrace(), switches)
    assert ran and sentence.endswith("the decoder's upscaling and cross attention, 4 memory cross-attentions' keys "
                                     "and the mask downsampler's convs on the Triton kernels; no call fell back")
    model.memory_encoder.mask_downsampler.conv_impl = "module"  # planted: the mask convs left behind
    ran, sentence = PROOFS["triton"](model, RunTrace(), switches)
    assert not ran and sentence == ("triton: 1 module(s) stayed off the Triton kernels: "
                                    "memory_encoder.mask_downsampler (convs)")
    model.memory_encoder.mask_downsampler.conv_impl = "triton"
    model.memory_attention.layers[3].cross_attn_image.key_impl = "module"  # planted: one memory's keys left behind
    ran, sentence = PROOFS["triton"](model, RunTrace(), switches)
    assert not ran and sentence == ("triton: 1 module(s) stayed off the Triton kernels: "
                                    "memory_attention.layers.3.cross_attn_image (keys)")
    model.memory_attention.layers[3].cross_attn_image.key_impl = "triton"
    model.prompt_decoder().upscale_impl = "gemm"  # planted: the switch left the upscaling behind
    ran, sentence = PROOFS["triton"](model, RunTrace(), switches)
    assert not ran and sentence == "triton: 1 module(s) stayed off the Triton kernels: prompt decoder's upscaling"
    model.prompt_decoder().transformer.fused_cross_attention = False  # planted: and the cross attentions
    ran, sentence = PROOFS["triton"](model, RunTrace(), switches)
    assert not ran and sentence.endswith("prompt decoder's upscaling, prompt decoder's cross attention")
    model.image_encoder.trunk.blocks[2].attn.attn_impl = "sdpa"  # planted: and a small-window attention
    ran, sentence = PROOFS["triton"](model, RunTrace(), switches)
    assert not ran and sentence.startswith("triton: 3 module(s) stayed off the Triton kernels: image_encoder.trunk.blocks.2.attn")
