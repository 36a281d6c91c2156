"""The fused rel-pos attention kernel against float64 math, on the CPU through TRITON_INTERPRET=1.

The kernel module picks the interpreted or compiled Triton kernel per call from TRITON_INTERPRET
(both are built at import), so setting the variable per test is enough, whatever was imported
before. Every test draws fresh seeded inputs with a bias of realistic size (rel ~ N(0, 2)).
The planted-defect test replays the published kernel's bug (bias not scaled by log2 e under
exp2) and requires the very tolerance used everywhere else to reject it.
"""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is not installed")

from samfast.kernels import (  # noqa: E402
    fallback_counts,
    forms_bias_from_tables,
    rel_factors_from_tables,
    relpos_attention,
    relpos_attention_from_tables,
    relpos_attention_reference,
    reset_fallback_counts,
)
from tests.kernel_accuracy import node_seed  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreted")

# The module (samfast.kernels.relpos_attention as an attribute is the function, not the module).
rpa = importlib.import_module("samfast.kernels.relpos_attention")

FP32_RTOL, FP32_ATOL = 1e-4, 1e-5
FP16_MAX_ABS = 2e-3


def make_inputs(seed, B, H, kh, kw, D, dtype, rel_std=2.0, permuted=True):
    """qkv (3, B, H, L, D) as SAM builds it (a permuted view of the projection), rel_h, rel_w."""
    g = torch.Generator().manual_seed(seed)
    L = kh * kw
    if permuted:
        qkv = torch.randn(B, L, 3, H, D, generator=g).to(dtype).permute(2, 0, 3, 1, 4)
    else:
        qkv = torch.randn(3, B, H, L, D, generator=g).to(dtype)
    rel_h = (rel_std * torch.randn(B, H, L, kh, generator=g)).to(dtype)
    rel_w = (rel_std * torch.randn(B, H, L, kw, generator=g)).to(dtype)
    return qkv, rel_h, rel_w


def math_fp64(qkv, rel_h, rel_w, scale=None):
    """Plain float64 attention with the bias written out index by index (no SDPA)."""
    q, k, v = qkv.double().unbind(0)
    rel_h, rel_w = rel_h.double(), rel_w.double()
    B, H, L, D = q.shape
    kw = rel_w.shape[-1]
    j = torch.arange(L)
    bias = rel_h[..., j // kw] + rel_w[..., j % kw]
    scale = D**-0.5 if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale + bias
    return torch.softmax(scores, dim=-1) @ v


def error_vs_math(out, ref, dtype) -> tuple[bool, str]:
    assert out.shape == ref.shape
    assert not torch.isnan(out).any(), "NaN in output"
    diff = (out.double() - ref).abs()
    if dtype == torch.float32:
        excess = (diff - (FP32_ATOL + FP32_RTOL * ref.abs())).max().item()
        return excess <= 0, f"fp32 max abs err {diff.max().item():.3g} (rtol {FP32_RTOL}, atol {FP32_ATOL})"
    return diff.max().item() <= FP16_MAX_ABS, f"max abs err {diff.max().item():.3g} > {FP16_MAX_ABS}"


def assert_matches_math(out, ref, dtype):
    ok, msg = error_vs_math(out, ref, dtype)
    assert ok, msg


# (B, H, kh, kw, D) with the interpreter's BLOCK_N = 16, covering the kernel's three bias paths:
# selection products over a padded key grid (small tables: kh != kw, L not a multiple of the
# block; rel_w formed once where the grid's padded row width divides the block, per tile where it
# does not), a key tile inside one key row (kw == BLOCK_N: rel_w hoisted; kw a multiple of
# BLOCK_N: rel_w slice) and the elementwise gather (kw > 64 and not a multiple of BLOCK_N). Head
# dims that are not a power of 2 run as two column blocks: 80 = 64 + 16, 48 = 32 + 16, 112 =
# 64 + 64 with the last 16 columns masked.
SHAPES = [
    pytest.param(1, 1, 3, 5, 16, id="B1H1-3x5-D16-grid"),
    pytest.param(2, 2, 4, 4, 64, id="B2H2-4x4-D64-grid"),
    pytest.param(1, 2, 3, 5, 80, id="B1H2-3x5-D80-grid"),
    pytest.param(1, 1, 3, 5, 112, id="B1H1-3x5-D112-grid"),
    pytest.param(2, 1, 7, 7, 64, id="B2H1-7x7-D64-grid"),
    pytest.param(1, 2, 3, 20, 32, id="B1H2-3x20-D32-grid-rw-per-tile"),
    pytest.param(1, 2, 2, 16, 32, id="B1H2-2x16-D32-row-tile"),
    pytest.param(1, 1, 2, 16, 48, id="B1H1-2x16-D48-row-tile"),
    pytest.param(2, 1, 2, 32, 80, id="B2H1-2x32-D80-row-slice"),
    pytest.param(1, 1, 2, 65, 16, id="B1H1-2x65-D16-gather"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("B,H,kh,kw,D", SHAPES)
def test_kernel_matches_fp64_math(request, B, H, kh, kw, D, dtype):
    inputs = make_inputs(node_seed(request), B, H, kh, kw, D, dtype)
    out = relpos_attention(*inputs)
    assert fallback_counts() == {}, "the kernel did not run"
    assert out.dtype == dtype and out.shape == inputs[0].shape[1:]
    assert_matches_math(out, math_fp64(*inputs), dtype)


@pytest.mark.parametrize("block_m,block_n", [(32, 16), (16, 32), (64, 64)])
def test_other_block_sizes(request, monkeypatch, block_m, block_n):
    """Blocks bigger than L, BLOCK_M != BLOCK_N, L (= 45) not a multiple of either."""
    monkeypatch.setattr(rpa, "_INTERPRET_BLOCK_M", block_m)
    monkeypatch.setattr(rpa, "_INTERPRET_BLOCK_N", block_n)
    inputs = make_inputs(node_seed(request), 2, 2, 5, 9, 16, torch.float32)
    out = relpos_attention(*inputs)
    assert fallback_counts() == {}
    assert_matches_math(out, math_fp64(*inputs), torch.float32)


def test_contiguous_inputs_and_explicit_scale(request):
    inputs = make_inputs(node_seed(request), 1, 2, 4, 4, 16, torch.float32, permuted=False)
    out = relpos_attention(*inputs, scale=0.3)
    assert_matches_math(out, math_fp64(*inputs, scale=0.3), torch.float32)


def test_output_transposes_to_a_view(request):
    out = relpos_attention(*make_inputs(node_seed(request), 2, 2, 4, 4, 16, torch.float32))
    merged = out.transpose(1, 2)
    assert merged.is_contiguous(), "kernel output should be (B, L, H, D) memory"


def test_head_dim_runs_as_power_of_2_blocks_without_padding_where_it_can():
    """vit_h's 80 as 64 + 16 columns: padded to 128 it wasted 3/8 of both matmuls (the math tests
    would not notice a return to padding; this does)."""
    split = {d: rpa._split_head_dim(d) for d in range(16, 129, 16)}
    assert split[80] == (64, 16) and split[64] == (64, 0) and split[96] == (64, 32) and split[48] == (32, 16)
    for d, (lo, hi) in split.items():
        assert lo + hi >= d and lo & (lo - 1) == 0 and hi & (hi - 1) == 0, (d, lo, hi)
        assert lo + hi == d or d == 112, f"head dim {d} padded to {lo + hi}"


# one shape per bias path
DEFECT_SHAPES = [s for s in SHAPES if s.id in ("B1H1-3x5-D16-grid", "B1H2-3x20-D32-grid-rw-per-tile", "B1H2-2x16-D32-row-tile", "B2H1-2x32-D80-row-slice", "B1H1-2x65-D16-gather")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("B,H,kh,kw,D", DEFECT_SHAPES)
def test_planted_defect_bias_without_log2e_fails(request, B, H, kh, kw, D, dtype):
    """The published kernel's bug (exp2 with an unscaled bias) must fail the same tolerance."""
    inputs = make_inputs(node_seed(request), B, H, kh, kw, D, dtype)
    ref = math_fp64(*inputs)
    assert error_vs_math(relpos_attention(*inputs), ref, dtype)[0]
    defective = relpos_attention(*inputs, _bias_log2e=False)
    ok, msg = error_vs_math(defective, ref, dtype)
    assert not ok, f"the tolerance let the log2(e) defect through: {msg}"


def test_planted_defect_is_caught_even_at_small_bias(request):
    """At rel ~ N(0, 1) the defect still exceeds the fp16 tolerance many times over."""
    inputs = make_inputs(node_seed(request), 1, 1, 4, 4, 64, torch.float16, rel_std=1.0)
    diff = (relpos_attention(*inputs, _bias_log2e=False).double() - math_fp64(*inputs)).abs().max()
    assert diff > 10 * FP16_MAX_ABS


# --------------------------------------------------------------------------- bias formed from tables


def make_table_inputs(seed, B, H, kh, kw, D, dtype):
    """qkv as in make_inputs and the two (2k-1, D) tables, scaled so that rel ~ N(0, 2) as there."""
    qkv, _, _ = make_inputs(seed, B, H, kh, kw, D, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    table_h, table_w = ((2.0 / D**0.5) * torch.randn(2 * n - 1, D, generator=g) for n in (kh, kw))
    return qkv, table_h.to(dtype), table_w.to(dtype)


def tables_math_fp64(qkv, table_h, table_w):
    return math_fp64(qkv, *rel_factors_from_tables(qkv[0].double(), table_h.double(), table_w.double()))


TABLE_SHAPES = [s for s in SHAPES if "grid" in s.id] + [pytest.param(2, 2, 14, 14, 64, id="B2H2-14x14-D64-window")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("B,H,kh,kw,D", TABLE_SHAPES)
def test_bias_from_tables_matches_fp64_math(request, B, H, kh, kw, D, dtype):
    inputs = make_table_inputs(node_seed(request), B, H, kh, kw, D, dtype)
    assert forms_bias_from_tables(*inputs)
    out = relpos_attention_from_tables(*inputs)
    assert fallback_counts() == {}, "the kernel did not run"
    assert out.dtype == dtype and out.shape == inputs[0].shape[1:]
    assert_matches_math(out, tables_math_fp64(*inputs), dtype)


@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_bias_from_tables_across_query_blocks(request, monkeypatch, block_m):
    """Query blocks that start mid-row and run past L (the gather's clamped indices)."""
    monkeypatch.setattr(rpa, "_INTERPRET_BLOCK_M", block_m)
    inputs = make_table_inputs(node_seed(request), 1, 2, 5, 9, 16, torch.float32)
    qkv, table_h, table_w = inputs
    assert_matches_math(relpos_attention_from_tables(*inputs, scale=0.3), math_fp64(
        qkv, *rel_factors_from_tables(qkv[0].double(), table_h.double(), table_w.double()), scale=0.3
    ), torch.float32)


def test_planted_defect_bias_from_tables_without_log2e_fails(request):
    inputs = make_table_inputs(node_seed(request), 1, 2, 3, 5, 16, torch.float16)
    ok, msg = error_vs_math(relpos_attention_from_tables(*inputs, _bias_log2e=False), tables_math_fp64(*inputs), torch.float16)
    assert not ok, f"the tolerance let the log2(e) defect through: {msg}"


def test_rel_factors_from_tables_are_the_models_decomposed_rel_pos(request):
    """The PyTorch form of the tables' product equals SAM's decomposed rel-pos (segment_anything's math)."""
    from samfast.sam1.image_encoder import decomposed_rel_pos

    qkv, table_h, table_w = make_table_inputs(node_seed(request), 2, 3, 5, 7, 16, torch.float32)
    q, table_h, table_w = qkv[0].double(), table_h.double(), table_w.double()
    for got, want in zip(rel_factors_from_tables(q, table_h, table_w), decomposed_rel_pos(q, table_h, table_w, (5, 7))):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_bias_from_tables_refuses_what_it_cannot_serve(request):
    """Key rows a key tile can hold whole (kw = 16) take the rel_h / rel_w route; the error names it."""
    inputs = make_table_inputs(node_seed(request), 1, 1, 2, 16, 16, torch.float32)
    assert not forms_bias_from_tables(*inputs)
    with pytest.raises(ValueError, match="rel_factors_from_tables"):
        relpos_attention_from_tables(*inputs)
    qkv, table_h, _ = inputs
    with pytest.raises(ValueError, match=r"\(2\*kh-1, D\)"):
        relpos_attention_from_tables(qkv, table_h, table_h[:5])


def test_windowed_attention_block_forms_its_bias_in_the_kernel(request, monkeypatch):
    """SAM's windowed attention under the triton switch skips decomposed_rel_pos and equals the math path."""
    from samfast.sam1 import image_encoder

    torch.manual_seed(node_seed(request))
    attn = image_encoder.Attention(dim=64, num_heads=2, input_size=(14, 14)).requires_grad_(False)
    torch.nn.init.normal_(attn.rel_pos_h, std=0.3)
    torch.nn.init.normal_(attn.rel_pos_w, std=0.3)
    x = torch.randn(3, 14, 14, 64)
    expected = attn(x)  # attn_impl "math": segment_anything's operation order
    attn.attn_impl = "triton"
    monkeypatch.setattr(image_encoder, "decomposed_rel_pos", None)  # a call would fail: the kernel must form the bias
    torch.testing.assert_close(attn(x), expected, rtol=1e-4, atol=1e-5)
    assert fallback_counts() == {}


# --------------------------------------------------------------------------- fallback


@pytest.mark.parametrize(
    "dtype,D,reason_part",
    [
        (torch.float64, 16, "dtype float64"),
        (torch.bfloat16, 16, "dtype bfloat16"),
        (torch.float32, 33, "head dim 33"),
    ],
    ids=["fp64", "bf16-interpreter", "D33"],
)
def test_unsupported_inputs_fall_back_visibly(request, caplog, dtype, D, reason_part):
    inputs = make_inputs(node_seed(request), 1, 2, 3, 5, D, dtype)
    with caplog.at_level(logging.WARNING, logger="samfast.kernels"):
        out = relpos_attention(*inputs)
        out2 = relpos_attention(*inputs)
    counts = fallback_counts()
    assert len(counts) == 1
    (reason, n), = counts.items()
    assert reason_part in reason and n == 2
    records = [r for r in caplog.records if r.name == "samfast.kernels"]
    assert len(records) == 1, "warn once per reason"
    assert reason_part in records[0].getMessage()
    torch.testing.assert_close(out, out2)
    ref = math_fp64(*inputs)
    if dtype == torch.float64:
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    elif dtype == torch.bfloat16:
        assert (out.double() - ref).abs().max() <= 2e-2  # bf16 output rounding
    else:
        assert_matches_math(out, ref, dtype)


def test_cpu_without_interpreter_falls_back(request, monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET")
    inputs = make_inputs(node_seed(request), 2, 1, 3, 5, 16, torch.float32)
    with caplog.at_level(logging.WARNING, logger="samfast.kernels"):
        out = relpos_attention(*inputs)
    assert fallback_counts() == {"cpu tensors without TRITON_INTERPRET=1": 1}
    assert any("TRITON_INTERPRET" in r.getMessage() for r in caplog.records)
    assert_matches_math(out, math_fp64(*inputs), torch.float32)


def test_autograd_falls_back_and_has_gradients(request):
    qkv, rel_h, rel_w = make_inputs(node_seed(request), 1, 1, 3, 5, 16, torch.float32)
    qkv = qkv.detach().requires_grad_()
    out = relpos_attention(qkv, rel_h, rel_w)
    out.sum().backward()
    assert qkv.grad is not None and torch.isfinite(qkv.grad).all()
    assert list(fallback_counts()) == ["autograd (the kernel has no backward)"]


def test_reset_fallback_counts(request):
    inputs = make_inputs(node_seed(request), 1, 1, 3, 5, 16, torch.float64)
    relpos_attention(*inputs)
    assert sum(fallback_counts().values()) == 1
    reset_fallback_counts()
    assert fallback_counts() == {}


def test_reference_matches_fp64_math(request):
    inputs = make_inputs(node_seed(request), 2, 2, 3, 5, 16, torch.float64)
    torch.testing.assert_close(relpos_attention_reference(*inputs), math_fp64(*inputs), rtol=1e-10, atol=1e-12)


def test_bad_shapes_raise(request):
    qkv, rel_h, rel_w = make_inputs(node_seed(request), 1, 1, 3, 5, 16, torch.float32)
    with pytest.raises(ValueError, match="kh \\* kw"):
        relpos_attention(qkv, rel_h[..., :2], rel_w)
    with pytest.raises(ValueError, match=r"\(3, B, H, L, D\)"):
        relpos_attention(qkv[0], rel_h, rel_w)
    with pytest.raises(ValueError, match=r"\(3, B, H, L, D\)"):
        forms_bias_from_tables(qkv[:2], rel_h[0, 0], rel_w[0, 0])


# --------------------------------------------------------------------------- op and compile


def test_custom_op_schema_and_fake_impl(request):
    qkv, rel_h, rel_w = make_inputs(node_seed(request), 1, 2, 4, 4, 16, torch.float32)
    op = torch.ops.samfast.relpos_attention.default
    result = torch.library.opcheck(
        op, (qkv, rel_h, rel_w, 0.25, True), test_utils=("test_schema", "test_faketensor")
    )
    assert set(result.values()) == {"SUCCESS"}


def test_fallback_under_compile_has_no_graph_break(request, monkeypatch):
    """On CPU without the interpreter compile takes the fallback; counting it must not break the graph."""
    monkeypatch.delenv("TRITON_INTERPRET")
    inputs = make_inputs(node_seed(request), 1, 2, 3, 5, 16, torch.float32)

    def f(qkv, rel_h, rel_w):
        return relpos_attention(qkv, rel_h, rel_w) * 2

    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(f)(*inputs)
    finally:
        torch._dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    assert fallback_counts() == {"cpu tensors without TRITON_INTERPRET=1": 1}
