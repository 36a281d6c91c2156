"""SAM 3's vision backbone: samfast.sam3.vit.ViT and samfast.sam3.neck.Sam3DualViTDetNeck equal sam3 0.1.4's
ViT, Sam3DualViTDetNeck and PositionEmbeddingSine in fp32 on the CPU, with the same weights.

sam3's modules are built directly, with SAM 3's options (_create_vit_backbone, _create_vit_neck) and
small sizes; every parameter is drawn from a seeded generator (sam3's init leaves norms at 1 and biases
at 0, which would hide a missing bias or a norm applied twice) and loaded strictly into samfast's.

Tolerances: samfast runs sam3's operations in sam3's order (SDPA where sam3 uses SDPA; the RoPE
rotation in real arithmetic gives the complex product's bits: tests/unit/test_rope.py), so the outputs
are the same bits on one machine; measured max abs diff 0.0 for every output here. The asserts are
exact; a change that reorders the arithmetic must say so by loosening them with a measured tolerance.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

# through the harness, whose import of sam3 keeps TF32 as it was (sam3 turns it on at import with a GPU)
pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")
vitdet = pytest.importorskip("sam3.model.vitdet", reason="the SAM 3 reference package sam3==0.1.4 is not installed")

from sam3.model.necks import Sam3DualViTDetNeck as TheirNeck  # noqa: E402
from sam3.model.position_encoding import PositionEmbeddingSine as TheirPositionEncoding  # noqa: E402

from samfast.modeling.rope import axial_cis, rotations_of  # noqa: E402
from samfast.modeling.windows import window_partition, window_unpartition  # noqa: E402
from samfast.modeling.position_encoding import PositionEmbeddingSine  # noqa: E402
from samfast.sam3.neck import Sam3DualViTDetNeck  # noqa: E402
from samfast.sam3.vit import Block, ViT  # noqa: E402

SMALL = dict(img_size=112, pretrain_img_size=56, patch_size=14, embed_dim=64, depth=4, num_heads=4,
             window_size=4, global_att_blocks=(1, 3))
# the options _create_vit_backbone fixes, which samfast's ViT does not take (its only code path)
SAM3_VIT_OPTIONS = dict(mlp_ratio=4.625, norm_layer="LayerNorm", qkv_bias=True, use_abs_pos=True, tile_abs_pos=True,
                        rel_pos_blocks=(), use_rope=True, use_interp_rope=True, pretrain_use_cls_token=True,
                        retain_cls_token=False, ln_pre=True, ln_post=False, bias_patch_embed=False)
REAL = dict(img_size=1008, pretrain_img_size=336, patch_size=14, embed_dim=1024, depth=32, num_heads=16,
            window_size=24, global_att_blocks=(7, 15, 23, 31))


def assert_same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def seed_parameters(module: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn from a seeded normal: norm weights around 1, everything else around 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            is_norm_weight = name.endswith("weight") and p.ndim == 1
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1 + (1.0 if is_norm_weight else 0.0))


def sam3_vit(**sizes) -> torch.nn.Module:
    model = vitdet.ViT(**(SAM3_VIT_OPTIONS | sizes)).eval()
    seed_parameters(model, seed=0)
    return model


def samfast_vit(theirs: torch.nn.Module, **sizes) -> ViT:
    ours = ViT(**sizes).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours


def images(img_size: int) -> torch.Tensor:
    return torch.randn(2, 3, img_size, img_size, generator=torch.Generator().manual_seed(1))


VIT_CASES = {
    "windows": SMALL,
    # 10 x 10 tokens in 4 x 4 windows: the last row and column of windows are half zero padding, and
    # the 4 x 4 pretraining position grid is tiled 2.5 times
    "padded-windows": SMALL | dict(img_size=140),
    "every-global-block-returned": SMALL | dict(return_interm_layers=True),
    "position-grid-untiled": SMALL | dict(pretrain_img_size=112),
}


@pytest.mark.parametrize("sizes", VIT_CASES.values(), ids=VIT_CASES.keys())
def test_vit_equals_sam3(sizes):
    theirs = sam3_vit(**sizes)
    ours = samfast_vit(theirs, **sizes)
    x = images(sizes["img_size"])
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert len(got) == len(expected) == (2 if sizes.get("return_interm_layers") else 1)
    for o, t in zip(got, expected):
        assert_same(o, t)
    # and the other way: sam3 loads samfast's state dict strictly
    vitdet.ViT(**(SAM3_VIT_OPTIONS | sizes)).load_state_dict(ours.state_dict(), strict=True)


def test_window_partition_with_padding_equals_sam3():
    """The partition the blocks use pads as sam3's does (zeros after the last row and column) and its
    inverse drops the padding again."""
    x = torch.randn(2, 10, 10, 8)
    windows, pad_hw = window_partition(x, 4)
    their_windows, their_pad_hw = vitdet.window_partition(x, 4)
    assert pad_hw == their_pad_hw == (12, 12)
    assert_same(windows, their_windows)
    assert_same(window_unpartition(windows, 4, pad_hw, (10, 10)),
                vitdet.window_unpartition(their_windows, 4, their_pad_hw, (10, 10)))
    assert_same(window_unpartition(windows, 4, pad_hw, (10, 10)), x)


def test_real_size_window_block_equals_sam3():
    """One block at SAM 3's width (1024 channels, 16 heads, 4736-wide MLP) on one 24 x 24 window."""
    theirs = vitdet.Block(1024, 16, mlp_ratio=4.625, window_size=24, input_size=(72, 72), use_rope=True,
                          rope_pt_size=(24, 24), rope_interp=True).eval()
    seed_parameters(theirs, seed=2)
    ours = Block(1024, 16, mlp_ratio=4.625, window_size=24, input_size=(72, 72), rope_pt_size=24).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(1, 24, 24, 1024, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_same(ours(x), theirs(x))


def test_real_size_global_block_rotations_equal_sam3():
    """A global block at SAM 3's size rotates by sam3's table: 72 x 72 positions scaled by 24 / 72.
    (Its forward over 5184 tokens is too slow for a CPU unit test; the small ViTs run global blocks.)"""
    theirs = vitdet.Attention(1024, 16, input_size=(72, 72), use_rope=True, rope_pt_size=(24, 24), rope_interp=True)
    ours = Block(1024, 16, mlp_ratio=4.625, window_size=0, input_size=(72, 72), rope_pt_size=24).attn
    assert_same(ours.freqs_cis, theirs.freqs_cis)
    cis = theirs.freqs_cis
    assert_same(ours.rotations, torch.stack([cis.real.repeat_interleave(2, -1),
                                             torch.stack([-cis.imag, cis.imag], -1).flatten(-2)]))


def test_real_size_state_dict_has_sam3s_keys_and_shapes():
    """SAM 3's ViT and dual neck at full size: the same keys (in sam3's order), shapes and dtypes as sam3's
    (built on the meta device: no memory, no init; the neck without the SAM 2 branches is held to sam3's by
    test_neck_equals_sam3's strict load). sam3 reads its drop-path rates with .item(), which a meta tensor
    cannot give, so its linspace (of those training-only rates) runs on the CPU here."""
    cpu_linspace = torch.linspace
    on_cpu = mock.patch.object(torch, "linspace", lambda *a, **k: cpu_linspace(*a, **k, device="cpu"))
    with torch.device("meta"), on_cpu:
        theirs = TheirNeck(vitdet.ViT(**(SAM3_VIT_OPTIONS | REAL)), TheirPositionEncoding(256), d_model=256,
                           scale_factors=(4.0, 2.0, 1.0, 0.5), add_sam2_neck=True).state_dict()
        ours = Sam3DualViTDetNeck(ViT(), d_model=256, add_sam2_neck=True).state_dict()
    assert list(ours) == list(theirs)
    assert all(ours[k].shape == theirs[k].shape and ours[k].dtype == theirs[k].dtype for k in theirs)
    # the trunk's 420 (13 a block), each neck's 22 (weight and bias of 4 1x1, 4 3x3 and 3 transposed convs)
    assert len(theirs) == 420 + 2 * 22


def small_necks(add_sam2_neck: bool) -> tuple[torch.nn.Module, Sam3DualViTDetNeck]:
    theirs = TheirNeck(vitdet.ViT(**(SAM3_VIT_OPTIONS | SMALL)), TheirPositionEncoding(32), d_model=32,
                       scale_factors=(4.0, 2.0, 1.0, 0.5), add_sam2_neck=add_sam2_neck).eval()
    seed_parameters(theirs, seed=4)
    ours = Sam3DualViTDetNeck(ViT(**SMALL), d_model=32, add_sam2_neck=add_sam2_neck).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return theirs, ours


@pytest.mark.parametrize("add_sam2_neck", [False, True], ids=["sam3-neck", "with-sam2-neck"])
def test_neck_equals_sam3(add_sam2_neck):
    theirs, ours = small_necks(add_sam2_neck)
    x = images(SMALL["img_size"])
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert [t.shape[-1] for t in got[0]] == [32, 16, 8, 4]
    if not add_sam2_neck:
        assert got[2:] == expected[2:] == (None, None)
        got, expected = got[:2], expected[:2]
    for got_list, expected_list in zip(got, expected):
        assert len(got_list) == len(expected_list) == 4
        for o, t in zip(got_list, expected_list):
            assert_same(o, t)


def test_position_encoding_equals_sam3_at_sam3s_sizes():
    """The neck's four map sizes at 1008 px, 256 channels, normalized (_create_position_encoding); one image
    (the necks' tests run two)."""
    theirs, ours = TheirPositionEncoding(256, normalize=True), PositionEmbeddingSine(256)
    for side in (288, 144, 72, 36):
        x = torch.zeros(1, 1, side, side)
        assert_same(ours(x), theirs(x))


# Planted defects: each comparison above fails on a change of the kind it guards against.


def test_a_perturbed_weight_fails_the_vit_comparison():
    theirs = sam3_vit(**SMALL)
    ours = samfast_vit(theirs, **SMALL)
    with torch.no_grad():
        ours.blocks[2].mlp.fc2.bias[0] += 1e-4
        expected, got = theirs(images(112)), ours(images(112))
    with pytest.raises(AssertionError):
        assert_same(got[0], expected[0])


def test_dropped_or_unscaled_rotations_fail_the_vit_comparison():
    """Without RoPE in one window block, or with the global blocks' positions not scaled by
    window / grid (sam3's use_interp_rope), the outputs differ."""
    theirs = sam3_vit(**SMALL)
    x = images(112)
    with torch.no_grad():
        expected = theirs(x)[0]
        dropped = samfast_vit(theirs, **SMALL)
        dropped.blocks[0].attn.rotations = rotations_of(torch.ones_like(dropped.blocks[0].attn.freqs_cis))
        unscaled = samfast_vit(theirs, **SMALL)
        unscaled.blocks[1].attn.rotations = rotations_of(axial_cis(16, 8, 8))
        for planted in (dropped, unscaled):
            with pytest.raises(AssertionError):
                assert_same(planted(x)[0], expected)


def test_rotations_follow_a_loaded_table():
    """The rotations a block uses are the loaded state dict's freqs_cis, not only the ones it built:
    with a changed table loaded into both, the outputs still agree, and differ from before."""
    theirs = sam3_vit(**SMALL)
    x = images(112)
    with torch.no_grad():
        before = theirs(x)[0]
        state = theirs.state_dict()
        turn = torch.polar(torch.tensor(1.0), torch.tensor(0.3))
        state["blocks.1.attn.freqs_cis"] = state["blocks.1.attn.freqs_cis"] * turn
        theirs.load_state_dict(state, strict=True)
        ours = samfast_vit(theirs, **SMALL)
        expected = theirs(x)[0]
        assert_same(ours(x)[0], expected)
    with pytest.raises(AssertionError):
        assert_same(expected, before)


def test_a_perturbed_sam2_branch_fails_only_its_comparison():
    theirs, ours = small_necks(add_sam2_neck=True)
    with torch.no_grad():
        ours.sam2_convs[1].conv_3x3.bias[0] += 1e-4
        expected, got = theirs(images(112)), ours(images(112))
    for o, t in zip(got[0], expected[0]):
        assert_same(o, t)
    with pytest.raises(AssertionError):
        assert_same(got[2][1], expected[2][1])
