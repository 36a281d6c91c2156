"""What the compile switch rewrites in SAM 2's image encoder computes what the modules compute.

- PatchEmbed.as_gemm: the 7x7 stride-4 conv as one GEMM over unfolded 8x8 patches (a zero tap in
  front), exact in fp64 for map sizes that do and do not divide by the stride;
- HieraMLP.add_to on the "epilogue" path: the residual accumulated inside lin2's GEMM (addmm);
- the neck's positional encodings filled before compiling, so the graph holds no sine or cosine;
- Hiera's residual stream kept in window order from block to block (Hiera.forward_windowed), both
  residuals accumulated inside GEMMs and the biases deferred, against the map-order forward in fp64;
- the decoder's conv_s0 / conv_s1 folded into the neck's 1x1 convs (FpnNeck.project_high_res), and the
  model's forward_image with them there, against the convs applied after the encoder in fp64;
- Hiera's positional table resized by matrix products, channels last (hiera.resized_pos_embed_by_matmul),
  against F.interpolate's bicubic in fp64 and in bf16, and compiled with the window-order stream: a
  change to the tables after compiling is seen;
- the window-order stream with its first norms writing a channel of ones and qkv / proj taking their
  biases from it (MultiScaleBlock.bias_as_channel, the triton switch's), on the reference path in fp64
  and on the kernel under the interpreter in fp32, and compiled.

Each comparison has a planted defect beside it that the same assertion catches.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from samfast import kernels
from samfast.modeling.common import linear_gelu_tanh
from samfast.sam2.backbones import hiera as hiera_module
from samfast.sam2.backbones import image_encoder as image_encoder_module
from samfast.sam2.backbones import neck as neck_module
from samfast.sam2.backbones.hiera import Hiera, MultiScaleBlock, PatchEmbed
from samfast.sam2.backbones.neck import FpnNeck
from samfast.sam2.build import build_sam2_model
from samfast.sam2.sam2_base import build_sam2_modules
from samfast.sam2.config import sam2_config
from samfast.sam2.mlp import HieraMLP


def fp64_patch_embed(seed: int = 0) -> PatchEmbed:
    torch.manual_seed(seed)
    return PatchEmbed(embed_dim=24).double()


@pytest.mark.parametrize("hw", [(64, 64), (37, 50), (33, 31)])
def test_patch_embed_as_gemm_equals_the_convolution_in_fp64(hw):
    embed = fp64_patch_embed()
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    conv = embed(x)
    embed.as_gemm = True
    torch.testing.assert_close(embed(x), conv, rtol=0, atol=1e-12)


def test_patch_embed_with_the_input_padded_one_row_short_is_caught():
    """The planted defect: the zero tap in front but the input padded by p, not p + 1, in front:
    every output reads its window one pixel off, and the same assertion fails."""
    embed = fp64_patch_embed()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    conv = embed(x)
    patches = F.pad(x, (3, 4, 3, 4)).unfold(2, 8, 4).unfold(3, 8, 4).permute(0, 2, 3, 1, 4, 5).reshape(1, 16, 16, -1)
    weight = F.pad(embed.proj.weight, (1, 0, 1, 0)).reshape(24, -1)
    shifted = F.linear(patches, weight, embed.proj.bias)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(shifted, conv, rtol=0, atol=1e-12)


def fp64_mlp() -> tuple[HieraMLP, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    mlp = HieraMLP(16, 64).double()
    for p in mlp.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return mlp, torch.randn(2, 5, 7, 16, dtype=torch.float64), torch.randn(2, 5, 7, 16, dtype=torch.float64)


def test_mlp_residual_in_the_gemm_equals_the_separate_add():
    mlp, residual, x = fp64_mlp()
    mlp.gelu_impl = "epilogue"
    expected = residual + mlp(x)
    torch.testing.assert_close(mlp.add_to(residual, x), expected, rtol=0, atol=1e-12)


def test_mlp_residual_in_the_gemm_without_lin2s_bias_is_caught():
    """The planted defect: the residual given to addmm without lin2's bias."""
    mlp, residual, x = fp64_mlp()
    lin1, lin2 = mlp.layers
    hidden = linear_gelu_tanh(x, lin1.weight, lin1.bias)
    no_bias = torch.addmm(residual.reshape(-1, 16), hidden.reshape(-1, 64), lin2.weight.t()).view(residual.shape)
    mlp.gelu_impl = "epilogue"
    assert (no_bias - (residual + mlp(x))).abs().max() > 1e-3


def test_mlp_add_to_off_the_epilogue_path_is_the_module_sum():
    mlp, residual, x = fp64_mlp()
    assert mlp.gelu_impl == "module"
    torch.testing.assert_close(mlp.add_to(residual, x), residual + mlp(x), rtol=0, atol=0)


@pytest.fixture(scope="module")
def hiera_t():
    return build_sam2_model("sam2.1_hiera_t", device="cpu", stages="fp32")


@pytest.mark.parametrize("hw", [(256, 256), (320, 192)])
def test_trunk_output_sizes_are_the_sizes_it_outputs(hiera_t, hw):
    trunk = hiera_t.image_encoder.trunk
    with torch.no_grad():
        outputs = trunk(torch.randn(1, 3, *hw))
    assert trunk.output_sizes(hw) == [tuple(out.shape[-2:]) for out in outputs]


def traced_calls(compile_with, sample) -> set[str]:
    """The names of the calls in the FX graphs dynamo traces when compile_with(backend) runs sample."""
    graphs = []

    def backend(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        compile_with(backend)(sample)
    torch._dynamo.reset()
    return {str(node.target) for gm in graphs for node in gm.graph.nodes if node.op in ("call_function", "call_method")}


def test_compiling_the_encoder_fills_its_positional_encodings_first(monkeypatch):
    """ImageEncoder.compile fills the neck's encodings of the model's input size, so the graph holds no
    sine or cosine; the planted defect, torch.compile on the bare module, computes them in the graph.
    The input size is 256 here, not 1024: the same code at a sixteenth of the pixels each trace runs."""
    monkeypatch.setattr(image_encoder_module, "IMAGE_SIZE", 256)
    encoder = build_sam2_model("sam2.1_hiera_t", device="cpu", stages="fp32").image_encoder
    sample = torch.randn(1, 3, 256, 256)
    assert "sin" in traced_calls(lambda backend: torch.compile(encoder, backend=backend, fullgraph=True), sample)

    def module_compile(backend):
        encoder.compile(backend=backend, fullgraph=True)
        return encoder

    assert not {"sin", "cos"} & traced_calls(module_compile, sample)


def small_hiera(window_spec=(4, 2, 4, 2)) -> Hiera:
    """A Hiera whose windows tile its maps at a 128 input (patch map 32): stage 3's windows (4) differ
    from the pooled stage 2's (1), so the stream is re-cut there, and block 4 attends globally."""
    torch.manual_seed(0)
    trunk = Hiera(embed_dim=8, num_heads=1, stages=(1, 2, 3, 1), global_att_blocks=(4,),
                  window_pos_embed_bkg_spatial_size=(4, 4), window_spec=window_spec).double()
    for p in trunk.parameters():
        torch.nn.init.normal_(p, std=0.2)
    for block in trunk.blocks:
        block.mlp.gelu_impl = "epilogue"
    return trunk


def map_order_outputs(trunk: Hiera, x: torch.Tensor, monkeypatch) -> list[torch.Tensor]:
    with monkeypatch.context() as m:
        m.setattr(trunk, "keeps_window_order", lambda hw: False)
        return trunk(x)


def test_the_stream_kept_in_window_order_equals_the_map_order_forward_in_fp64(monkeypatch):
    trunk = small_hiera()
    x = torch.randn(2, 3, 128, 128, dtype=torch.float64)
    with torch.no_grad():
        assert trunk.keeps_window_order((32, 32))
        windowed = trunk(x)
        expected = map_order_outputs(trunk, x, monkeypatch)
    for ours, ref in zip(windowed, expected, strict=True):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)


def cut_without_permuting(x: torch.Tensor, size: int) -> torch.Tensor:
    b, h, w, c = x.shape
    return x.reshape(b, h // size, w // size, size, size, c)


def biases_dropped(original):
    def forward_windowed(self, stream, bias):
        stream, bias = original(self, stream, bias)
        return stream, torch.zeros_like(bias)
    return forward_windowed


@pytest.mark.parametrize("defect", ["windows cut without permuting", "the deferred biases dropped"])
def test_the_window_order_stream_with_a_planted_defect_is_caught(defect, monkeypatch):
    trunk = small_hiera()
    x = torch.randn(1, 3, 128, 128, dtype=torch.float64)
    with torch.no_grad():
        expected = map_order_outputs(trunk, x, monkeypatch)
        with monkeypatch.context() as m:
            if defect == "windows cut without permuting":
                m.setattr(hiera_module, "to_windows", cut_without_permuting)  # the name hiera.py calls
            else:
                m.setattr(MultiScaleBlock, "forward_windowed", biases_dropped(MultiScaleBlock.forward_windowed))
            broken = trunk(x)
    assert max((ours - ref).abs().max().item() for ours, ref in zip(broken, expected)) > 1e-3


def with_biases_as_channels(trunk: Hiera) -> Hiera:
    for block in trunk.blocks:
        block.bias_as_channel = True
    return trunk


def test_the_stream_with_biases_as_channels_equals_the_map_order_forward_in_fp64(monkeypatch):
    """Every block's first norm with the channel of ones (kernels.norm_with_bias_channel's reference path:
    the kernel takes no fp64), qkv and the width-doubling proj reading it."""
    x = torch.randn(2, 3, 128, 128, dtype=torch.float64)
    trunk = small_hiera()
    with torch.no_grad():
        want = map_order_outputs(trunk, x, monkeypatch)
        got = with_biases_as_channels(trunk)(x)
    for ours, ref in zip(got, want, strict=True):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)


@pytest.mark.usefixtures("triton_interpreted")
def test_the_stream_with_biases_as_channels_on_the_kernel_equals_the_map_order_forward(monkeypatch):
    """The same in fp32 with the norm on its Triton kernel (interpreted): it ran in every block, and the
    outputs agree to fp32 rounding."""
    pytest.importorskip("triton", reason="Triton is not installed")
    x = torch.randn(1, 3, 128, 128)
    trunk = small_hiera().float()
    with torch.no_grad():
        want = map_order_outputs(trunk, x, monkeypatch)
        got = with_biases_as_channels(trunk)(x)
    assert kernels.fallback_counts() == {}
    for ours, ref in zip(got, want, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_hiera_ls_blocks_with_biases_as_channels_are_its_first_two_stages_but_the_first_block():
    """bias_as_channel_pays on Hiera-L: blocks 1-7 (144 and 288 channels, qkv into 432 and 864); block 0's
    norm inductor fuses with the making of the stream; from block 8 (qkv 288 -> 1728) cuBLASLt's bias
    epilogue is as fast."""
    with torch.device("meta"):
        model = build_sam2_modules(sam2_config("sam2.1_hiera_l"))
    assert list(model.bias_channel_blocks()) == [f"image_encoder.trunk.blocks.{i}" for i in range(1, 8)]


def test_the_stream_stays_in_map_order_where_windows_pad_or_mlps_are_not_on_gemms():
    trunk = small_hiera()
    assert trunk.keeps_window_order((32, 32))
    assert not trunk.keeps_window_order((36, 36))  # 36 is no multiple of the 8 the stages need
    assert not small_hiera(window_spec=(4, 2, 3, 2)).keeps_window_order((32, 32))  # 3-windows pad an 8 map
    trunk.blocks[3].mlp.gelu_impl = "module"
    assert not trunk.keeps_window_order((32, 32))


@pytest.mark.parametrize("model_type,windowed", [("sam2.1_hiera_l", True), ("sam2.1_hiera_t", False)])
def test_which_configs_keep_window_order_at_1024(model_type, windowed):
    """hiera_l's windows (8, 4, 16, 8) tile its 256..32 maps; hiera_t's 14-windows pad its 64 map."""
    config = sam2_config(model_type)
    with torch.device("meta"):
        trunk = Hiera(embed_dim=config.embed_dim, num_heads=config.num_heads, stages=config.stages,
                      global_att_blocks=config.global_att_blocks,
                      window_pos_embed_bkg_spatial_size=config.window_pos_embed_bkg_spatial_size,
                      window_spec=config.window_spec)
    for block in trunk.blocks:
        block.mlp.gelu_impl = "epilogue"
    assert trunk.keeps_window_order((256, 256)) is windowed


@pytest.mark.slow(reason="inductor compiles a small Hiera trunk to C++, the first parameter's compile filling the cache")
@pytest.mark.parametrize("biases_as_channels", [False, True])
def test_the_window_order_stream_compiles_to_what_it_computes_eagerly(biases_as_channels):
    """Inductor runs the in-place accumulations (samfast::linear_accumulate) on the stream's own
    buffers; compiled and eager agree to fp32 rounding, through the re-cut and the global block, with
    the biases as channels or not. The positional table is resized by matmul, as the compile switch
    sets it (test_the_compile_switch_rewrites_the_encoder), and recomputed on every call: changed after
    compiling (as a planted defect or a second load_state_dict changes it), the compiled trunk follows,
    with no recompile to notice it."""
    trunk = small_hiera().float()
    trunk.pos_embed_by_matmul = True
    if biases_as_channels:
        with_biases_as_channels(trunk)
    x = torch.randn(2, 3, 128, 128)
    torch._dynamo.reset()
    compiled = torch.compile(trunk, fullgraph=True, dynamic=False)
    with torch.no_grad():
        for _ in range(2):
            for ours, ref in zip(compiled(x), trunk(x), strict=True):
                torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
            trunk.pos_embed.add_(1.0)
    torch._dynamo.reset()


@pytest.mark.parametrize("table_hw, window_hw, hw", [((7, 7), (4, 4), (12, 8)), ((7, 6), (1, 1), (5, 3)),
                                                     ((14, 14), (8, 4), (16, 24))])
def test_the_positional_table_by_matmul_equals_the_bicubic_resize_in_fp64(table_hw, window_hw, hw):
    """Up and down, square and not; the planted defect (the two sides swapped) is caught."""
    torch.manual_seed(0)
    table, window = torch.randn(1, 6, *table_hw, dtype=torch.float64), torch.randn(1, 6, *window_hw, dtype=torch.float64)
    want = hiera_module.resized_pos_embed(table, window, hw)
    got = hiera_module.resized_pos_embed_by_matmul(table, window, hw)
    assert got.is_contiguous() and got.shape == (1, *hw, 6)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    swapped = hiera_module.resized_pos_embed_by_matmul(table, window, hw[::-1]).transpose(1, 2)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(swapped, want, rtol=0, atol=1e-6)


def test_the_positional_table_by_matmul_in_bf16_is_within_its_two_roundings():
    """hiera_l's shapes (144 channels, 7 x 7 table, 8 x 8 window, 256 x 256 map) in bf16: within the
    error bound of F.interpolate's path, which rounds twice (the resize, then the window's sum); the
    products round once. The planted defect (the window table transposed) is caught."""
    torch.manual_seed(0)
    table, window = torch.randn(1, 144, 7, 7).bfloat16(), torch.randn(1, 144, 8, 8).bfloat16()
    want = hiera_module.resized_pos_embed(table.double(), window.double(), (256, 256))
    resized = hiera_module.resized_pos_embed(table.double(), torch.zeros(1, 144, 1, 1, dtype=torch.float64), (256, 256))
    got = hiera_module.resized_pos_embed_by_matmul(table, window, (256, 256))
    assert got.dtype == torch.bfloat16
    # each rounding is off by at most bf16's unit roundoff 2^-8 of what it rounds (slack for fp32's own)
    bound = 2**-8 * (resized.abs() + want.abs()) * 1.01 + 1e-6
    assert ((got.double() - want).abs() <= bound).all()
    swapped = hiera_module.resized_pos_embed_by_matmul(table, window.transpose(2, 3), (256, 256))  # planted defect
    assert not ((swapped.double() - want).abs() <= bound).all()


def fp64_neck_and_heads() -> tuple[FpnNeck, tuple[torch.nn.Conv2d, ...], list[torch.Tensor]]:
    """A 4-level neck of width 16 (top-down sums on levels 2 and 3, as every config), heads 16 -> 2 and 16 -> 4
    (conv_s0 / conv_s1 are 256 -> 32 / 64), trunk maps of widths 6 to 48, all with non-zero biases."""
    torch.manual_seed(0)
    neck = FpnNeck(16, [48, 24, 12, 6]).double()
    heads = (torch.nn.Conv2d(16, 2, 1).double(), torch.nn.Conv2d(16, 4, 1).double())
    for module in (neck, *heads):
        for p in module.parameters():
            torch.nn.init.normal_(p, std=0.5)
    maps = [torch.randn(2, width, size, size, dtype=torch.float64) for width, size in ((6, 16), (12, 8), (24, 4), (48, 2))]
    return neck, heads, maps


def heads_after_the_neck(neck, heads, maps) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    out, pos = neck(maps)
    return [head(level) for head, level in zip(heads, out)] + out[len(heads):], pos


def test_high_res_heads_folded_into_the_neck_equal_them_applied_after_it_in_fp64():
    neck, heads, maps = fp64_neck_and_heads()
    want_out, want_pos = heads_after_the_neck(neck, heads, maps)
    neck.project_high_res(heads)
    got_out, got_pos = neck(maps)
    for got, want in zip(got_out + got_pos, want_out + want_pos):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_high_res_heads_folded_without_the_necks_bias_are_caught(monkeypatch):
    """The planted defect: the fold drops W2 b1 (the neck conv's bias seen through the head)."""
    neck, heads, maps = fp64_neck_and_heads()
    want_out, _ = heads_after_the_neck(neck, heads, maps)

    def fold_without_first_bias(x, first, second):
        return F.conv2d(x, (second.weight.flatten(1) @ first.weight.flatten(1))[..., None, None], second.bias)

    monkeypatch.setattr(neck_module, "folded_1x1", fold_without_first_bias)
    neck.project_high_res(heads)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(neck(maps)[0][0], want_out[0], rtol=0, atol=1e-12)


def test_a_head_on_a_level_of_the_top_down_sum_is_refused():
    neck, heads, _ = fp64_neck_and_heads()
    with pytest.raises(ValueError, match="top-down sum"):
        neck.project_high_res((*heads, heads[0]))  # level 2 takes the top-down sum


def test_forward_image_with_the_heads_in_the_encoder_equals_sam2s_order():
    """The model's forward_image as the compile switch leaves it (the heads in the neck, conv_s0 / conv_s1
    not applied again) against the fp32 stage's, on the trained nano in fp64 (at a 512 input: the fold
    is per pixel, so a quarter of the pixels checks it as well)."""
    model = build_sam2_model("sam2.1_hiera_nano", "trained", device="cpu", stages="fp32").double()
    images = torch.randn(1, 3, 512, 512, dtype=torch.float64)
    with torch.no_grad():
        want = model.forward_image(images)
        model.rewrite_encoder_for_compile()
        got = model.forward_image(images)
    for key in ("backbone_fpn", "vision_pos_enc"):
        for g, w in zip(got[key], want[key]):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-9)
    assert [f.shape[1] for f in got["backbone_fpn"]] == [32, 64, 256]  # conv_s0 / conv_s1's widths


@pytest.mark.parametrize("stages, rewritten", [("fp32", False), ("bf16+sdpa", False), ("bf16+compile+sdpa", True)])
def test_the_compile_switch_rewrites_the_encoder(stages, rewritten):
    model = build_sam2_model("sam2.1_hiera_nano", "trained", device="cpu", stages=stages)
    decoder = model.sam_mask_decoder
    assert model.image_encoder.neck.high_res_heads == ((decoder.conv_s0, decoder.conv_s1) if rewritten else ())
    assert model.image_encoder.trunk.pos_embed_by_matmul is rewritten
    assert "high_res_heads" not in str(list(model.state_dict()))  # the decoder's parameters, under their own keys
