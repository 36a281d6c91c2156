"""Attention within Hiera's smallest windows: one program per (window, head), the whole window at once.

Every Hiera's second stage attends within 4 x 4 windows: 16 queries, and 16 keys (64 in the stage's
first block, whose queries are pooled from 8 x 8 windows; the third stage's first block pools 4 x 4
windows to 4 queries). At batch 8 Hiera-L has 32768 to 65536 such (window, head) sequences a block,
heads of 72 channels, and cuDNN's flash kernel tiles each one 64 queries x 128 keys, mostly padding.
Here one program takes a whole window. At 64 queries a window cuDNN is as fast or faster, so the triton switch
routes only attentions whose windows fit MAX_QUERIES and MAX_KEYS here (:func:`fits`;
samfast.sam2.sam2_base). Measured: docs/measurements/sam2-encoder/window-attention-h100-2026-11-26.md.

A program loads its window's queries, keys and values once (a head's channels as two power-of-2 tiles
in registers, 72 = 64 + 16 with 8 masked: :func:`split_channels`; never padded in memory), takes
softmax(q k^T * scale) v with no running maximum to carry (every key is in one tile), and writes its
rows. q, k and v are read through their strides, so Hiera's views of its qkv projection need no copy;
the output is allocated (B, L, H, D) and returned as its (B, H, L, D) view, the layout Hiera's output
projection reads.

Arithmetic: fp32 scores and softmax; the probabilities rounded to the input dtype before their
product with v, as flash attention rounds them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samfast.kernels.dispatch import (
    TritonKernel,
    dot_precision,
    launcher,
    note_fallback,
    tl,
    triton,
    unsupported_reason,
)

__all__ = ["MAX_KEYS", "MAX_QUERIES", "fits", "window_attention", "window_attention_reference"]

MAX_QUERIES = 16  # queries a window may have here: at 64, cuDNN's kernel is as fast (above)
MAX_KEYS = 64  # keys a window may have: one (queries, keys) fp32 tile of scores in registers
MAX_HEAD_DIM = 128  # a head's channels: at most two register tiles of 64 (split_channels)
LOG2E = 1.4426950408889634


def fits(queries: int, keys: int) -> bool:
    """Whether windows of this many queries and keys are this kernel's to take."""
    return queries <= MAX_QUERIES and keys <= MAX_KEYS


def window_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v for (B, H, L, D) inputs: SDPA, the path Hiera's attention takes otherwise."""
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def _window_attention_fwd(
    Q, K, V, Out,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_ob, stride_oh, stride_ol, stride_od,
    H,
    LQ: tl.constexpr,
    LK: tl.constexpr,
    D: tl.constexpr,
    QK_SCALE: tl.constexpr,  # scale * log2(e): a constexpr, as inductor hands float arguments over as fp64
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,  # LQ and LK padded to powers of 2, at least 16 (tl.dot's least)
    BLOCK_N: tl.constexpr,
    D_HEAD: tl.constexpr,  # a head's channels as two power-of-2 parts (split_channels): 72 = 64 + 16 (8 masked)
    D_TAIL: tl.constexpr,  # 0: none
):
    # Builtins only (tl.reduce with the standard combine, not tl.max / tl.sum), as in relpos_attention.py:
    # the library helpers would tie the kernel to the TRITON_INTERPRET of import time.
    pid = tl.program_id(0)
    b = (pid // H).to(tl.int64)
    h = (pid % H).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    in_rows = rows[:, None] < LQ
    in_cols = cols[:, None] < LK
    q_rows = Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_ql
    k_rows = K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kl
    v_rows = V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vl
    o_rows = Out + b * stride_ob + h * stride_oh + rows[:, None] * stride_ol
    head = tl.arange(0, D_HEAD)[None, :]
    in_head = head < D
    k = tl.load(k_rows + head * stride_kd, mask=in_cols & in_head, other=0.0)
    scores = tl.dot(tl.load(q_rows + head * stride_qd, mask=in_rows & in_head, other=0.0), tl.trans(k),
                    input_precision=PRECISION)
    if D_TAIL > 0:
        tail = D_HEAD + tl.arange(0, D_TAIL)[None, :]
        in_tail = tail < D
        k = tl.load(k_rows + tail * stride_kd, mask=in_cols & in_tail, other=0.0)
        scores = tl.dot(tl.load(q_rows + tail * stride_qd, mask=in_rows & in_tail, other=0.0), tl.trans(k), scores,
                        input_precision=PRECISION)
    scores = tl.where(cols[None, :] < LK, scores * QK_SCALE, float("-inf"))
    p = tl.math.exp2(scores - tl.reduce(scores, 1, tl.standard._elementwise_max)[:, None])
    total = tl.reduce(p, 1, tl.standard._sum_combine)[:, None]
    p = p.to(V.dtype.element_ty)
    v = tl.load(v_rows + head * stride_vd, mask=in_cols & in_head, other=0.0)
    out = tl.dot(p, v, input_precision=PRECISION) / total
    tl.store(o_rows + head * stride_od, out.to(Out.dtype.element_ty), mask=in_rows & in_head)
    if D_TAIL > 0:
        v = tl.load(v_rows + tail * stride_vd, mask=in_cols & in_tail, other=0.0)
        out = tl.dot(p, v, input_precision=PRECISION) / total
        tl.store(o_rows + tail * stride_od, out.to(Out.dtype.element_ty), mask=in_rows & in_tail)


# one program per (window, head): only the warps to choose (the interpreter takes the first)
_CONFIGS = [triton.Config({}, num_warps=w, num_stages=1) for w in (1, 2, 4)] if triton is not None else []
_KERNEL = TritonKernel(_window_attention_fwd, _CONFIGS, key=["LQ", "LK", "D"])


def _new_output(q: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) over (B, L, H, D) memory: the rows Hiera's output projection reads, in place."""
    b, h, lq, d = q.shape
    return q.new_empty(b, lq, h, d).transpose(1, 2)


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def split_channels(d: int) -> tuple[int, int]:
    """A head's d channels as (head, tail) tiles of powers of 2, each at least 16 (tail 0 when head holds
    them all): 72 -> (64, 16), 96 -> (64, 32), 64 -> (64, 0), 8 -> (16, 0). Padding 72 to one tile of 128
    made the products 1.8x the work
    (docs/measurements/sam2-encoder/window-attention-head-split-h200-2026-11-28.md)."""
    head = max(16, 1 << (d.bit_length() - 1))
    return (head, 0) if head >= d else (head, _block(d - head))


def _window_attention_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    out = _new_output(q)
    kernel, meta = _KERNEL.pick()
    b, h, lq, d = q.shape
    lk = k.shape[2]
    launcher()(kernel)[(b * h,)](
        q, k, v, out,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        h,
        LQ=lq,
        LK=lk,
        D=d,
        QK_SCALE=scale * LOG2E,
        PRECISION=dot_precision(q.dtype),
        BLOCK_M=_block(lq),
        BLOCK_N=_block(lk),
        **dict(zip(("D_HEAD", "D_TAIL"), split_channels(d))),
        **meta,
    )
    return out


if triton is not None and hasattr(torch.library, "triton_op"):
    # A custom op, so torch.compile sees one node and no graph break (see relpos_attention.py).
    @torch.library.triton_op("samfast::window_attention", mutates_args=())
    def _window_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return _window_attention_kernel(q, k, v, scale)

    @_window_attention_op.register_fake
    def _(q, k, v, scale):
        return _new_output(q)

    def _run(q, k, v, scale):
        return torch.ops.samfast.window_attention(q, k, v, scale)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable
    _run = _window_attention_kernel


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v for q (B, H, Lq, D) and k, v (B, H, Lk, D) of any strides, Lq <= MAX_QUERIES,
    Lk <= MAX_KEYS, D <= MAX_HEAD_DIM; the output (B, H, Lq, D) is a view of (B, Lq, H, D) memory.

    Runs the kernel on CUDA (fp16, bf16, fp32) or under TRITON_INTERPRET=1 (fp16, fp32); otherwise
    :func:`window_attention_reference`, the reason counted in samfast.kernels.dispatch.
    """
    if q.dim() != 4 or k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(f"window_attention takes q (B, H, Lq, D) and k, v (B, H, Lk, D); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    reason = unsupported_reason((q, k, v))
    if reason is None and not (fits(q.shape[2], k.shape[2]) and q.shape[3] <= MAX_HEAD_DIM):
        reason = f"windows above {MAX_QUERIES} queries, {MAX_KEYS} keys or {MAX_HEAD_DIM} channels a head"
    if reason is not None:
        note_fallback("window_attention", reason, "SDPA")
        return window_attention_reference(q, k, v, scale)
    return _run(q, k, v, scale)
