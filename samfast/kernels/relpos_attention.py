"""Fused attention with SAM's decomposed relative-position bias, as one Triton kernel.

SAM's image encoder adds to every attention score a bias built from two small tables::

    bias[b, h, i, j] = rel_h[b, h, i, j // kw] + rel_w[b, h, i, j % kw]      (L = kh * kw)

The plain way materializes that (B, H, L, L) bias and hands it to SDPA; at L = 4096 that is
the largest tensor in the model. The kernel here is flash attention (online softmax over key
tiles) that forms each key tile's bias from the few rel_h / rel_w entries it needs, so the bias
never exists in memory: global attention (64x64 tokens) reads one rel_h column and a rel_w slice
per tile, windowed attention (14x14) selects from the tables with tiny tensor-core products.
How it compares with SDPA and a materialized bias: bench/kernel_bench.py,
docs/relpos-global-attention-h100.md and docs/relpos-windowed-attention-h100.md.

The softmax runs in base 2 (``exp2``), so *both* the scaled q.k product and the bias are
multiplied by log2(e). The published segment-anything-fast kernel scaled only q.k; the unit
tests keep a private switch (``_bias_log2e=False``) that replays that defect and must fail.

Public API: :func:`relpos_attention` (the kernel, with a counted and logged fallback),
:func:`relpos_attention_from_tables` (the kernel forming rel_h / rel_w from q itself, for
SAM's windows; :func:`forms_bias_from_tables` says where it serves, :func:`rel_factors_from_tables`
is the same product in PyTorch), :func:`relpos_attention_reference` (materialized bias + SDPA).
Fallbacks are counted in samfast.kernels.dispatch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samfast.kernels.dispatch import (
    TritonKernel,
    dot_precision,
    interpreting,
    launcher,
    note_fallback,
    tl,
    triton,
    unsupported_reason,
)

__all__ = [
    "forms_bias_from_tables",
    "rel_factors_from_tables",
    "relpos_attention",
    "relpos_attention_from_tables",
    "relpos_attention_reference",
]

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)

SUPPORTED_HEAD_DIMS = tuple(range(16, 129, 16))  # 64 (vit_b/l) and 80 (vit_h) among them

#: Block sizes the interpreter uses (no autotuning there). Tests may change these.
_INTERPRET_BLOCK_M = 16
_INTERPRET_BLOCK_N = 16


# --------------------------------------------------------------------------- reference path


def relpos_attention_reference(qkv, rel_h, rel_w, scale=None):
    """softmax(q k^T * scale + bias) v with the (B, H, L, L) bias materialized; SDPA does the rest.

    The slow, trusted path: what SAM's attention computes, and the fallback of
    :func:`relpos_attention`. Shapes as there.
    """
    _check_shapes(qkv, rel_h, rel_w)
    q, k, v = qkv.unbind(0)
    B, H, L, _ = q.shape
    bias = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(B, H, L, L).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def _check_qkv(qkv) -> None:
    if qkv.dim() != 5 or qkv.shape[0] != 3:
        raise ValueError(
            f"qkv must be q, k, v stacked as one (3, B, H, L, D) tensor (SAM's qkv projection "
            f"reshaped to (B, L, 3, H, D) and permuted (2, 0, 3, 1, 4)); got shape {tuple(qkv.shape)}"
        )


def _check_shapes(qkv, rel_h, rel_w) -> None:
    _check_qkv(qkv)
    _, B, H, L, _ = qkv.shape
    if rel_h.dim() != 4 or rel_w.dim() != 4 or rel_h.shape[:3] != (B, H, L) or rel_w.shape[:3] != (B, H, L):
        raise ValueError(
            f"rel_h, rel_w must be (B, H, L, kh) and (B, H, L, kw) with (B, H, L) = {(B, H, L)}; "
            f"got {tuple(rel_h.shape)}, {tuple(rel_w.shape)}"
        )
    if rel_h.shape[-1] * rel_w.shape[-1] != L:
        raise ValueError(f"L = {L} must equal kh * kw = {rel_h.shape[-1]} * {rel_w.shape[-1]}")


# --------------------------------------------------------------------------- the kernel


def _relpos_attn_fwd(
    QKV, RH, RW, Out,  # QKV: q, k, v stacked (3, B, H, L, D); one pointer, see relpos_attention
    stride_s, stride_b, stride_h, stride_m, stride_d,
    stride_rhb, stride_rhh, stride_rhm, stride_rhk,
    stride_rwb, stride_rwh, stride_rwm, stride_rwk,
    stride_ob, stride_oh, stride_om, stride_od,
    H,
    QK_SCALE: tl.constexpr,  # softmax scale * log2(e); constexpr: a float argument would be fp64 under inductor
    KH: tl.constexpr,
    KW: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_LO: tl.constexpr,  # the head dim as D_LO + D_HI columns, powers of 2 (see _split_head_dim)
    D_HI: tl.constexpr,  # 0 when HEAD_DIM is a power of 2
    KH_PAD: tl.constexpr,
    KW_PAD: tl.constexpr,
    SMALL_TABLES: tl.constexpr,  # KH_PAD <= 64 and KW_PAD <= 64
    FROM_TABLES: tl.constexpr,  # RH, RW are the (2*KH-1, D), (2*KW-1, D) tables: rel_h, rel_w formed from q here
    TH_PAD: tl.constexpr,  # row counts of those tables padded to a power of 2 (FROM_TABLES only)
    TW_PAD: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot's input_precision (dispatch.dot_precision)
    BIAS_LOG2E: tl.constexpr,  # False only in the planted-defect test (the published bug)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Only Triton builtins here (tl.full, not tl.zeros; tl.reduce with the standard combine
    # functions, not tl.max / tl.sum): those library helpers are @jit functions whose kind
    # (compiled or interpreted) is fixed when triton.language is imported, so calling them
    # would tie this kernel to the TRITON_INTERPRET of import time. Builtins work either way.
    L: tl.constexpr = KH * KW
    # How a key tile's bias is formed (decided at compile time):
    #   ROW:     KW % BLOCK_N == 0, the tile lies in one key row: one rel_h column + a rel_w slice
    #            (global attention, 64x64 tokens); when KW == BLOCK_N the slice is loop-invariant.
    #   GRID:    not ROW and SMALL_TABLES (windowed 14x14): the query block's rel_h / rel_w rows are
    #            formed once and each tile's bias is a tensor-core product with a 0/1 selection
    #            matrix, exact since each output picks exactly one table entry. Keys are walked in a
    #            KH x KW_PAD grid, key (ky, kx) at position ky * KW_PAD + kx (kx >= KW masked), so
    #            that when KW_PAD divides BLOCK_N (RW_FIXED) column c of every tile holds
    #            kx = c % KW_PAD: the rel_w part is then the same for all tiles, formed once, and
    #            each tile costs one selection product (rel_h) instead of two.
    #   GATHER:  otherwise, an elementwise gather of both tables.
    # With FROM_TABLES (GRID geometry only) rel_h / rel_w are not read but formed here:
    # rel_h[i, ky] = q_i . table_h[iy - ky + KH - 1] is a column gather from the tensor-core product
    # q @ table_h^T (likewise rel_w with ix, kx), which spares SAM the decomposed_rel_pos products
    # and the two copies of q they need.
    ROW: tl.constexpr = KW % BLOCK_N == 0
    GRID: tl.constexpr = (KW % BLOCK_N != 0) and SMALL_TABLES
    RW_FIXED: tl.constexpr = BLOCK_N % KW_PAD == 0  # GRID: every tile's columns hold the same kx

    if BIAS_LOG2E:
        bias_scale = 1.4426950408889634
    else:
        bias_scale = 1.0

    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_mask = offs_m < L
    # The head dim in two parts, each a power of 2 as tl.arange needs: vit_h's 80 as 64 + 16
    # instead of one padded block of 128, which wasted 3/8 of every product. The `_hi` tensors
    # (q_hi, k_hi, v_hi, acc_hi) exist only when D_HI > 0.
    offs_lo = tl.arange(0, D_LO)
    if D_HI > 0:
        offs_hi = D_LO + tl.arange(0, D_HI)
        hi_mask = offs_hi < HEAD_DIM  # all true but for head dims like 112 = 64 + 48 (read as 64 + 64)

    q_base = QKV + b * stride_b + h * stride_h
    k_base = q_base + stride_s
    v_base = q_base + 2 * stride_s
    q_rows = q_base + offs_m[:, None] * stride_m
    q = tl.load(q_rows + offs_lo[None, :] * stride_d, mask=m_mask[:, None], other=0.0)
    if D_HI > 0:
        q_hi = tl.load(q_rows + offs_hi[None, :] * stride_d, mask=m_mask[:, None] & hi_mask[None, :], other=0.0)

    rh_rows = RH + b * stride_rhb + h * stride_rhh + offs_m * stride_rhm  # (BLOCK_M,) row starts
    rw_rows = RW + b * stride_rwb + h * stride_rwh + offs_m * stride_rwm

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, D_LO], 0.0, dtype=tl.float32)
    if D_HI > 0:
        acc_hi = tl.full([BLOCK_M, D_HI], 0.0, dtype=tl.float32)

    if ROW:
        if KW == BLOCK_N:
            # Every key tile covers exactly one key row, so its rel_w columns are 0..KW-1: load once.
            rw_tile = tl.load(rw_rows[:, None] + offs_n[None, :] * stride_rwk, mask=m_mask[:, None], other=0.0)
            rw_tile = rw_tile.to(tl.float32) * bias_scale
    if GRID:  # this query block's rows of both tables, once
        offs_kh = tl.arange(0, KH_PAD)
        offs_kw = tl.arange(0, KW_PAD)
        if FROM_TABLES:  # formed from q (the caller guarantees FROM_TABLES only in this geometry)
            offs_th = tl.arange(0, TH_PAD)
            offs_tw = tl.arange(0, TW_PAD)
            th_rows = RH + offs_th[:, None] * stride_rhm
            tw_rows = RW + offs_tw[:, None] * stride_rwm
            th_mask = offs_th[:, None] < 2 * KH - 1
            tw_mask = offs_tw[:, None] < 2 * KW - 1
            table_h = tl.load(th_rows + offs_lo[None, :] * stride_rhk, mask=th_mask, other=0.0)
            table_w = tl.load(tw_rows + offs_lo[None, :] * stride_rwk, mask=tw_mask, other=0.0)
            qt_h = tl.dot(q, tl.trans(table_h), input_precision=PRECISION)  # (BLOCK_M, TH_PAD)
            qt_w = tl.dot(q, tl.trans(table_w), input_precision=PRECISION)
            if D_HI > 0:
                table_h = tl.load(th_rows + offs_hi[None, :] * stride_rhk, mask=th_mask & hi_mask[None, :], other=0.0)
                table_w = tl.load(tw_rows + offs_hi[None, :] * stride_rwk, mask=tw_mask & hi_mask[None, :], other=0.0)
                qt_h = tl.dot(q_hi, tl.trans(table_h), qt_h, input_precision=PRECISION)
                qt_w = tl.dot(q_hi, tl.trans(table_w), qt_w, input_precision=PRECISION)
            # clamped: padded columns (ky >= KH) and padded rows (i >= L) fetch a finite table
            # entry that the one-hot selection below multiplies by 0
            idx_h = (offs_m // KW)[:, None] - offs_kh[None, :] + (KH - 1)
            idx_w = (offs_m % KW)[:, None] - offs_kw[None, :] + (KW - 1)
            idx_h = tl.minimum(tl.maximum(idx_h, 0), TH_PAD - 1)
            idx_w = tl.minimum(tl.maximum(idx_w, 0), TW_PAD - 1)
            # rounded to q's dtype, as SAM's einsum products are (and for the one-hot dots)
            rh_blk = tl.gather(qt_h, idx_h, 1).to(q.dtype)
            rw_blk = tl.gather(qt_w, idx_w, 1).to(q.dtype)
        else:  # loaded
            rh_blk = tl.load(
                rh_rows[:, None] + offs_kh[None, :] * stride_rhk,
                mask=m_mask[:, None] & (offs_kh[None, :] < KH),
                other=0.0,
            )
            rw_blk = tl.load(
                rw_rows[:, None] + offs_kw[None, :] * stride_rwk,
                mask=m_mask[:, None] & (offs_kw[None, :] < KW),
                other=0.0,
            )
        if RW_FIXED:  # every tile's rel_w part, once: a product with a 0/1 selection matrix
            sel_w = ((offs_n % KW_PAD)[None, :] == offs_kw[:, None]).to(rw_blk.dtype)  # (KW_PAD, BLOCK_N)
            rw_grid = tl.dot(rw_blk, sel_w, input_precision=PRECISION)

    for start_n in range(0, KH * KW_PAD if GRID else L, BLOCK_N):
        if GRID:
            ky = (start_n + offs_n) // KW_PAD
            kx = (start_n + offs_n) % KW_PAD
            offs_kn = ky * KW + kx
            n_mask = (ky < KH) & (kx < KW)
        else:
            offs_kn = start_n + offs_n
            n_mask = offs_kn < L

        k_cols = k_base + offs_kn[None, :] * stride_m
        k = tl.load(k_cols + offs_lo[:, None] * stride_d, mask=n_mask[None, :], other=0.0)
        qk = tl.dot(q, k, input_precision=PRECISION)
        if D_HI > 0:
            k_hi = tl.load(k_cols + offs_hi[:, None] * stride_d, mask=n_mask[None, :] & hi_mask[:, None], other=0.0)
            qk = tl.dot(q_hi, k_hi, qk, input_precision=PRECISION)
        # The bias of this key tile, from the two small tables, added to q.k * scale.
        if ROW:
            # Every entry of the tile takes the same rel_h value per query row: rather than adding
            # it to the tile, the softmax below shifts each row's running max by it (per row, not
            # per entry). The bias then costs one fused multiply-add per entry, q.k * scale + rel_w:
            # as many per-entry operations as bias-free flash attention.
            row_bias = tl.load(rh_rows + (start_n // KW) * stride_rhk, mask=m_mask, other=0.0)
            row_bias = row_bias.to(tl.float32) * bias_scale
            if KW == BLOCK_N:
                qk = qk * QK_SCALE + rw_tile
            else:
                cols = (start_n % KW) + offs_n
                rw = tl.load(rw_rows[:, None] + cols[None, :] * stride_rwk, mask=m_mask[:, None], other=0.0)
                qk = qk * QK_SCALE + rw.to(tl.float32) * bias_scale
        elif GRID:
            # Tensor-core products with 0/1 selection matrices, exact since each output picks
            # exactly one table entry: this tile's rel_h part, added to the fixed rel_w part.
            sel_h = (ky[None, :] == offs_kh[:, None]).to(rh_blk.dtype)  # (KH_PAD, BLOCK_N)
            if RW_FIXED:
                bias = tl.dot(rh_blk, sel_h, rw_grid, input_precision=PRECISION)
            else:
                sel_w = (kx[None, :] == offs_kw[:, None]).to(rw_blk.dtype)
                bias = tl.dot(rh_blk, sel_h, input_precision=PRECISION)
                bias = tl.dot(rw_blk, sel_w, bias, input_precision=PRECISION)
            qk = qk * QK_SCALE + bias * bias_scale
        else:
            mn_mask = m_mask[:, None] & n_mask[None, :]
            rh = tl.load(rh_rows[:, None] + (offs_kn // KW)[None, :] * stride_rhk, mask=mn_mask, other=0.0)
            rw = tl.load(rw_rows[:, None] + (offs_kn % KW)[None, :] * stride_rwk, mask=mn_mask, other=0.0)
            qk = qk * QK_SCALE + (rh.to(tl.float32) + rw.to(tl.float32)) * bias_scale

        if GRID or L % BLOCK_N != 0:
            qk = tl.where(n_mask[None, :], qk, float("-inf"))

        # Online softmax in base 2: both q.k*scale and the bias carry the log2(e) factor. With ROW
        # the scores are qk + row_bias: m_new = max(m_i, rowmax(qk) + row_bias), and
        # exp2(qk + row_bias - m_new) = exp2(qk - (m_new - row_bias)).
        if ROW:
            m_new = tl.maximum(m_i, tl.reduce(qk, 1, tl.standard._elementwise_max) + row_bias)
            p = tl.math.exp2(qk - (m_new - row_bias)[:, None])
        else:
            m_new = tl.maximum(m_i, tl.reduce(qk, 1, tl.standard._elementwise_max))
            p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        p = p.to(QKV.dtype.element_ty)

        v_rows = v_base + offs_kn[:, None] * stride_m
        v = tl.load(v_rows + offs_lo[None, :] * stride_d, mask=n_mask[:, None], other=0.0)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PRECISION)
        if D_HI > 0:
            v_hi = tl.load(v_rows + offs_hi[None, :] * stride_d, mask=n_mask[:, None] & hi_mask[None, :], other=0.0)
            acc_hi = tl.dot(p, v_hi, acc_hi * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    o_rows = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om
    tl.store(o_rows + offs_lo[None, :] * stride_od, (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=m_mask[:, None])
    if D_HI > 0:
        tl.store(
            o_rows + offs_hi[None, :] * stride_od,
            (acc_hi / l_i[:, None]).to(Out.dtype.element_ty),
            mask=m_mask[:, None] & hi_mask[None, :],
        )


# A few configs for Hopper/Ampere, keyed on the attention geometry (dtype is added by Triton).
_AUTOTUNE_CONFIGS = (
    [
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=4, num_stages=2),
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=3),
    ]
    if triton is not None
    else []
)

_KERNEL = TritonKernel(_relpos_attn_fwd, _AUTOTUNE_CONFIGS, key=["KH", "KW", "HEAD_DIM", "FROM_TABLES"])


def _split_head_dim(d: int) -> tuple[int, int]:
    """(D_LO, D_HI): head dim d (a multiple of 16) as the kernel's two power-of-2 column blocks.

    D_LO is the largest power of 2 <= d, D_HI the power of 2 covering the rest (0 if none):
    80 -> (64, 16), 96 -> (64, 32), 64 -> (64, 0); 112 -> (64, 64), its last 16 columns masked.
    """
    lo = 1 << (d.bit_length() - 1)
    return lo, (triton.next_power_of_2(d - lo) if d > lo else 0)


def _launch(qkv, rel_h, rel_w, out, scale: float, bias_log2e: bool, launcher, config=None) -> None:
    """Launch the kernel; `config` (a triton.Config, GPU only) bypasses autotuning, for benchmarks.

    qkv is (3, B, H, L, D); rel_h, rel_w are either the (B, H, L, kh), (B, H, L, kw) factors or,
    2-D, the (2*kh-1, D), (2*kw-1, D) tables the kernel forms them from (see
    relpos_attention_from_tables).
    """
    _, B, H, L, D = qkv.shape
    d_lo, d_hi = _split_head_dim(D)
    from_tables = rel_h.dim() == 2
    if from_tables:
        KH, KW = (rel_h.shape[0] + 1) // 2, (rel_w.shape[0] + 1) // 2
        rel_strides = (0, 0, *rel_h.stride(), 0, 0, *rel_w.stride())
    else:
        KH, KW = rel_h.shape[-1], rel_w.shape[-1]
        rel_strides = (*rel_h.stride(), *rel_w.stride())
    if config is not None and not interpreting():
        kernel, meta = _KERNEL.compiled.fn, config.all_kwargs()
    else:
        kernel, meta = _KERNEL.pick(BLOCK_M=_INTERPRET_BLOCK_M, BLOCK_N=_INTERPRET_BLOCK_N)

    def grid(m):
        return (triton.cdiv(L, m["BLOCK_M"]), B * H)

    launcher(kernel)[grid](
        qkv, rel_h, rel_w, out,
        *qkv.stride(), *rel_strides, *out.stride(),
        H,
        QK_SCALE=scale * LOG2E,
        KH=KH,
        KW=KW,
        HEAD_DIM=D,
        D_LO=d_lo,
        D_HI=d_hi,
        KH_PAD=max(16, triton.next_power_of_2(KH)),
        KW_PAD=max(16, triton.next_power_of_2(KW)),
        SMALL_TABLES=max(KH, KW) <= 64,
        FROM_TABLES=from_tables,
        TH_PAD=max(16, triton.next_power_of_2(2 * KH - 1)),
        TW_PAD=max(16, triton.next_power_of_2(2 * KW - 1)),
        PRECISION=dot_precision(qkv.dtype),
        BIAS_LOG2E=bias_log2e,
        **meta,
    )


def _empty_out(q: torch.Tensor) -> torch.Tensor:
    # (B, L, H, D) memory seen as (B, H, L, D): SAM's following transpose(1, 2).reshape is free.
    B, H, L, D = q.shape
    return torch.empty((B, L, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)


def _relpos_attention_impl(qkv, rel_h, rel_w, scale: float, bias_log2e: bool) -> torch.Tensor:
    out = _empty_out(qkv[0])
    _launch(qkv, rel_h, rel_w, out, scale, bias_log2e, launcher())
    return out


if triton is not None and hasattr(torch.library, "triton_op"):
    # A custom op, so torch.compile sees one node and no graph break; being a triton_op, the
    # compiled graph launches (and inductor autotunes) the Triton kernel itself.
    # q, k, v enter the op and the kernel as one tensor (one pointer): inductor hands a user Triton
    # kernel its inputs with their eager strides, and three q, k, v views of a pointwise result
    # (the int8 stage's rescaled qkv projection) each became a buffer as large as the whole
    # projection (docs/int8-peak-memory-h100.md).
    @torch.library.triton_op("samfast::relpos_attention", mutates_args=())
    def _relpos_attention_op(
        qkv: torch.Tensor,
        rel_h: torch.Tensor,
        rel_w: torch.Tensor,
        scale: float,
        bias_log2e: bool,
    ) -> torch.Tensor:
        return _relpos_attention_impl(qkv, rel_h, rel_w, scale, bias_log2e)

    # A plain shape-only fake (triton_op's default traces the launch, which the interpreter
    # cannot do on fake tensors). Compile still decomposes the op into the kernel launch.
    @_relpos_attention_op.register_fake
    def _(qkv, rel_h, rel_w, scale, bias_log2e):
        return _empty_out(qkv[0])

    def _run_kernel(qkv, rel_h, rel_w, scale, bias_log2e):
        return torch.ops.samfast.relpos_attention(qkv, rel_h, rel_w, scale, bias_log2e)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable

    def _run_kernel(qkv, rel_h, rel_w, scale, bias_log2e):
        out = _empty_out(qkv[0])
        _launch(qkv, rel_h, rel_w, out, scale, bias_log2e, lambda kern: kern)
        return out


# --------------------------------------------------------------------------- dispatch


def _unsupported_reason(qkv, rel_h, rel_w) -> str | None:
    """Why the kernel cannot serve these inputs, or None when it can."""
    reason = unsupported_reason((qkv, rel_h, rel_w))
    if reason is None and qkv.shape[-1] not in SUPPORTED_HEAD_DIMS:
        reason = f"head dim {qkv.shape[-1]} not supported (a multiple of 16 up to 128)"
    return reason


def relpos_attention(qkv, rel_h, rel_w, scale=None, *, _bias_log2e: bool = True):
    """softmax(q @ k^T * scale + bias) @ v, bias[b,h,i,j] = rel_h[b,h,i,j//kw] + rel_w[b,h,i,j%kw].

    Args:
        qkv: q, k, v stacked, (3, B, H, L, D), any strides: SAM's qkv projection as
            ``qkv.reshape(B, L, 3, H, D).permute(2, 0, 3, 1, 4)`` (a view), or
            ``torch.stack((q, k, v))``. One tensor, so that under torch.compile q, k and v stay
            views of one buffer.
        rel_h: (B, H, L, kh) and rel_w: (B, H, L, kw) with kh * kw == L.
        scale: softmax scale; D ** -0.5 when None.

    Returns (B, H, L, D) in qkv's dtype, laid out as a transposed (B, L, H, D) tensor so that
    ``out.transpose(1, 2).reshape(B, L, H * D)`` is a view.

    Runs the fused Triton kernel on CUDA (fp16, bf16, fp32) or, under TRITON_INTERPRET=1, on
    any device (fp16, fp32). Otherwise it runs :func:`relpos_attention_reference`, counts the
    reason in :data:`samfast.kernels.dispatch.FALLBACK_COUNTS` and logs a warning once per reason.
    ``_bias_log2e=False`` replays the published defect (bias not scaled by log2 e): tests only.
    """
    _check_shapes(qkv, rel_h, rel_w)
    if scale is None:
        scale = qkv.shape[-1] ** -0.5
    reason = _unsupported_reason(qkv, rel_h, rel_w)
    if reason is not None:
        note_fallback("relpos_attention", reason, "the materialized-bias SDPA reference path")
        return relpos_attention_reference(qkv, rel_h, rel_w, scale=scale)
    return _run_kernel(qkv, rel_h, rel_w, float(scale), bool(_bias_log2e))


def _table_grid(q, table_h, table_w) -> tuple[int, int]:
    """(kh, kw) of the tables, after checking them against q: (2*kh-1, D), (2*kw-1, D), kh * kw = L."""
    if q.dim() != 4 or table_h.dim() != 2 or table_w.dim() != 2:
        raise ValueError(f"need q of shape (B, H, L, D) and 2-D tables; got {tuple(q.shape)}, "
                         f"{tuple(table_h.shape)}, {tuple(table_w.shape)}")
    kh, kw = (table_h.shape[0] + 1) // 2, (table_w.shape[0] + 1) // 2
    L, D = q.shape[-2:]
    if table_h.shape != (2 * kh - 1, D) or table_w.shape != (2 * kw - 1, D) or kh * kw != L:
        raise ValueError(f"tables must be (2*kh-1, D) and (2*kw-1, D) with kh * kw = L; got "
                         f"{tuple(table_h.shape)}, {tuple(table_w.shape)} for L = {L}, D = {D}")
    return kh, kw


def rel_factors_from_tables(q, table_h, table_w):
    """SAM's rel_h (B, H, L, kh), rel_w (B, H, L, kw) from q and the (2k-1, D) tables, in q's dtype.

    rel_h[b, h, i, ky] = q[b, h, i] . table_h[iy - ky + kh - 1], i = (iy, ix) row-major in a
    kh x kw grid (likewise rel_w with ix, kx): what segment_anything's decomposed rel-pos forms
    when queries and keys share the grid, as they do in every SAM block.
    """
    kh, kw = _table_grid(q, table_h, table_w)
    B, H, L, D = q.shape
    grid_h, grid_w = torch.arange(kh, device=q.device), torch.arange(kw, device=q.device)
    rh = table_h[grid_h[:, None] - grid_h[None, :] + kh - 1].to(q.dtype)  # (iy, ky, D)
    rw = table_w[grid_w[:, None] - grid_w[None, :] + kw - 1].to(q.dtype)  # (ix, kx, D)
    grid_q = q.reshape(B, H, kh, kw, D)
    rel_h = torch.einsum("bhyxd,ykd->bhyxk", grid_q, rh).reshape(B, H, L, kh)
    rel_w = torch.einsum("bhyxd,xkd->bhyxk", grid_q, rw).reshape(B, H, L, kw)
    return rel_h, rel_w


def forms_bias_from_tables(qkv, table_h, table_w) -> bool:
    """Whether :func:`relpos_attention_from_tables` can run the kernel on these inputs.

    It can on grids whose key rows no key tile holds whole (kw not a multiple of 16) with sides
    of at most 64 (SAM's 14 x 14 windows), for inputs the kernel serves at all.
    """
    _check_qkv(qkv)
    kh, kw = _table_grid(qkv[0], table_h, table_w)
    return kw % 16 != 0 and max(kh, kw) <= 64 and _unsupported_reason(qkv, table_h, table_w) is None


def relpos_attention_from_tables(qkv, table_h, table_w, scale=None, *, _bias_log2e: bool = True):
    """:func:`relpos_attention` with rel_h, rel_w formed inside the kernel from q and two tables.

    Args:
        qkv: (3, B, H, L, D), q, k, v stacked as in :func:`relpos_attention`, L = kh * kw.
        table_h, table_w: (2*kh-1, D) and (2*kw-1, D), the relative-position tables (SAM's
            rel_pos_h / rel_pos_w resized to the grid); see :func:`rel_factors_from_tables`.

    The answer of ``relpos_attention(qkv, *rel_factors_from_tables(qkv[0], table_h, table_w))``
    without the two batched products and the copies of q they cost. Only where
    :func:`forms_bias_from_tables` says so: elsewhere it raises ValueError naming that call.
    ``_bias_log2e=False`` replays the published defect, as in :func:`relpos_attention`.
    """
    if not forms_bias_from_tables(qkv, table_h, table_w):
        raise ValueError(
            f"the kernel does not form the bias from tables {tuple(table_h.shape)}, {tuple(table_w.shape)} "
            f"for {qkv.dtype} on {qkv.device}: call relpos_attention(qkv, *rel_factors_from_tables(qkv[0], table_h, table_w))"
        )
    if scale is None:
        scale = qkv.shape[-1] ** -0.5
    return _run_kernel(qkv, table_h, table_w, float(scale), bool(_bias_log2e))
