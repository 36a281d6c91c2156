"""The ladder's switches: parsing, and each CPU-runnable stage against fp32 on vit_tiny."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import samfast
from samfast.stages import StageError, canonical_name, parse_stages


def test_ladder_order():
    assert samfast.LADDER == ("fp32", "bf16", "compile", "sdpa", "triton", "nt", "int8", "sparse")


@pytest.mark.parametrize(
    "stages,switches",
    [
        ("fp32", set()),
        ("bf16", {"bf16"}),
        ("sdpa", {"bf16", "compile", "sdpa"}),
        ("sparse", set(samfast.LADDER[1:])),
        ("bf16+sdpa+int8", {"bf16", "sdpa", "int8"}),
        ("fp32+nt", {"nt"}),
        (" sdpa + bf16 ", {"bf16", "sdpa"}),
    ],
)
def test_parse_stages(stages, switches):
    assert parse_stages(stages) == switches


def test_canonical_names_round_trip():
    for name in samfast.LADDER:
        assert canonical_name(parse_stages(name)) == name
    assert canonical_name(parse_stages("sdpa+bf16")) == "bf16+sdpa"
    assert canonical_name(parse_stages("fp32+sdpa")) == "fp32+sdpa"
    for switches in (parse_stages("fp32+sdpa"), parse_stages("bf16+nt"), parse_stages("fp32+nt")):
        assert parse_stages(canonical_name(switches)) == switches


def test_fp8_is_the_lossless_stack_plus_fp8_not_a_rung_under_int8():
    assert parse_stages("fp8") == parse_stages("nt") | {"fp8"}
    assert "fp8" not in parse_stages("int8") | parse_stages("sparse")
    assert canonical_name(parse_stages("fp8")) == "fp8"
    assert canonical_name(parse_stages("bf16+sdpa+fp8")) == "bf16+sdpa+fp8"
    assert canonical_name(parse_stages("fp32+fp8")) == "fp32+fp8"


@pytest.mark.parametrize("both", ["int8+fp8", "bf16+sparse+fp8"])
def test_fp8_with_another_quantizer_is_refused(both):
    with pytest.raises(StageError, match="fp8 replaces the same encoder linears"):
        parse_stages(both)


@pytest.mark.parametrize("stages", ["fp8", "bf16+fp8"])
def test_fp8_on_cpu_is_refused_with_the_fix(stages):
    with pytest.raises(StageError, match=r"fp8 needs a CUDA GPU .* compute capability >= 8.9"):
        samfast.build_sam("vit_tiny", device="cpu", stages=stages)


def test_fp8_stages_are_held_to_fp8_thresholds():
    from parity.compare.gates import load_thresholds, thresholds_for

    thresholds = load_thresholds()
    assert thresholds_for("fp8", thresholds) is thresholds["fp8"]
    assert thresholds_for("fp32+fp8", thresholds) is thresholds["fp8"]
    assert thresholds["fp8"]["max_logits_rel_l2"] < thresholds["sparse"]["max_logits_rel_l2"]


@pytest.mark.parametrize("bad", ["fp16", "bf16+flash", "", "bf16++sdpa"])
def test_unknown_stage_names_are_refused(bad):
    with pytest.raises(StageError, match="choose from fp32 < bf16 < compile"):
        parse_stages(bad)


@pytest.fixture(scope="module")
def fp32_outputs():
    return _outputs("fp32")


def _outputs(stages: str):
    """Encoder features and decoder outputs of vit_tiny for a fixed image and three prompts."""
    model = samfast.build_sam("vit_tiny", device="cpu", stages=stages)
    predictor = samfast.SamPredictor(model)
    image = np.random.default_rng(0).integers(0, 256, (400, 600, 3), dtype=np.uint8)
    predictor.set_image(image)
    coords = torch.tensor([[[100.0, 120.0]], [[500.0, 300.0]], [[900.0, 600.0]]])
    masks, iou, low_res = predictor.predict_torch(coords, torch.ones(3, 1, dtype=torch.int))
    return predictor.features.float(), low_res.float(), iou.float()


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_bf16_runs_in_bf16_and_stays_close(fp32_outputs):
    model = samfast.build_sam("vit_tiny", device="cpu", stages="bf16")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.pixel_mean.dtype == torch.float32  # normalization constants keep their digits
    features, low_res, iou = _outputs("bf16")
    ref_features, ref_low_res, ref_iou = fp32_outputs
    # bf16 keeps 8 mantissa bits: ~0.4% per op; after 4 blocks and the decoder a few percent
    assert _rel_l2(features, ref_features) < 0.03
    assert _rel_l2(low_res, ref_low_res) < 0.05


def test_sdpa_alone_equals_fp32(fp32_outputs):
    features, low_res, iou = _outputs("fp32+sdpa")
    ref_features, ref_low_res, ref_iou = fp32_outputs
    torch.testing.assert_close(features, ref_features, rtol=0, atol=1e-4)
    torch.testing.assert_close(low_res, ref_low_res, rtol=0, atol=1e-4)


def test_triton_on_cpu_falls_back_visibly_and_equals_fp32(fp32_outputs, monkeypatch):
    from samfast import kernels

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernels.reset_fallback_counts()
    features, low_res, iou = _outputs("fp32+triton")
    assert sum(kernels.fallback_counts().values()) >= len(samfast.build_sam("vit_tiny", device="cpu").image_encoder.blocks)
    torch.testing.assert_close(low_res, fp32_outputs[1], rtol=0, atol=1e-4)


def test_patch_embed_as_gemm_equals_the_convolution():
    """The compile switch's GEMM form of the patch embedding is the same product as the conv (fp64)."""
    from samfast.modeling.patch_embed import PatchEmbed

    torch.manual_seed(0)
    embed = PatchEmbed(patch_size=16, in_chans=3, embed_dim=40).double()
    x = torch.randn(2, 3, 64, 96, dtype=torch.float64)
    conv = embed(x)
    embed.as_gemm = True
    gemm = embed(x)
    assert gemm.shape == conv.shape == (2, 4, 6, 40)
    torch.testing.assert_close(gemm, conv, rtol=1e-12, atol=1e-12)
    # a wrong patch flattening order (channels last instead of the weight's (C, p, p)) would not match
    wrong = x.reshape(2, 3, 4, 16, 6, 16).permute(0, 2, 4, 3, 5, 1).reshape(2, 4, 6, -1)
    assert not torch.allclose(torch.nn.functional.linear(wrong, embed.proj.weight.reshape(40, -1), embed.proj.bias), conv)


def test_compile_switch_turns_on_the_patch_embed_gemm():
    assert not samfast.build_sam("vit_tiny", device="cpu", stages="fp32").image_encoder.patch_embed.as_gemm
    assert samfast.build_sam("vit_tiny", device="cpu", stages="compile").image_encoder.patch_embed.as_gemm


def _sam1_mlp():
    from samfast.modeling.common import MLPBlock

    mlp = MLPBlock(16, 48)
    return mlp, mlp.lin1, mlp.lin2


def _hiera_mlp():
    from samfast.sam2.mlp import HieraMLP

    mlp = HieraMLP(16, 48)
    return mlp, *mlp.layers


@pytest.mark.parametrize("make_mlp", [_sam1_mlp, _hiera_mlp], ids=["sam1-MLPBlock", "sam2-HieraMLP"])
def test_linear_gelu_tanh_is_the_tanh_gelu_of_the_linear_and_compiles_whole(make_mlp):
    """The MLP's fused op means gelu(linear, approximate="tanh") on every device, and compiles without a break;
    SAM 1's MLPBlock and SAM 2's Hiera MLP take it the same way."""
    from samfast.modeling.common import linear_gelu_tanh

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 5, 16, dtype=torch.float64), torch.randn(48, 16, dtype=torch.float64), torch.randn(48, dtype=torch.float64)
    tanh = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
    torch.testing.assert_close(linear_gelu_tanh(x, w, b), tanh, rtol=1e-12, atol=1e-12)
    # ... and not the exact GELU (which the tanh form misses by up to 4.7e-4): the test can tell them apart
    assert (torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) - tanh).abs().max() > 1e-4

    mlp, lin1, lin2 = make_mlp()
    mlp.double().requires_grad_(False)
    exact = mlp(x)
    mlp.gelu_impl = "epilogue"
    fused = mlp(x)
    torch.testing.assert_close(fused, lin2(torch.nn.functional.gelu(lin1(x), approximate="tanh")), rtol=1e-12, atol=1e-12)
    assert (fused - exact).abs().max() < 1e-3  # the same MLP to the tanh form's accuracy
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(mlp, fullgraph=True)(x), fused, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "stages,gelu_impl",
    [
        ("fp32", "module"),
        ("bf16", "module"),
        ("compile", "epilogue"),
        ("fp32+compile", "module"),
        ("int8", "quantized_kernel"),
        ("bf16+compile+int8", "module"),
        ("bf16+triton+int8", "quantized_kernel"),
    ],
)
def test_each_stage_picks_its_mlp_gelu_path(stages, gelu_impl):
    """The GELU epilogue only on a plain bf16 encoder (the tanh GELU is within bf16's rounding, not
    fp32's; a quantized lin1 has no plain weight for the fused GEMM); the quantization kernel with
    a quantizing switch and the triton switch."""
    model = samfast.build_sam("vit_tiny", device="cpu", stages=stages)
    assert {block.mlp.gelu_impl for block in model.image_encoder.blocks} == {gelu_impl}


@pytest.mark.parametrize(
    "stages,upscale_impl,fused_cross_attention",
    [("fp32", "conv", False), ("bf16", "conv", False), ("compile", "gemm", False), ("bf16+triton", "triton", True)],
)
def test_each_stage_picks_its_decoder_paths(stages, upscale_impl, fused_cross_attention):
    """The decoder's kernels (fused upscaling, folded cross attentions) come with the triton switch."""
    decoder = samfast.build_sam("vit_tiny", device="cpu", stages=stages).mask_decoder
    assert (decoder.upscale_impl, decoder.transformer.fused_cross_attention) == (upscale_impl, fused_cross_attention)
