"""The quantized MLP's middle: GELU and the per-token quantization of its output in one pass.

With dynamic quantization (torchao's fp8 rowwise or int8 configs) an MLP runs lin1's quantized
GEMM, then a GELU pass over the (tokens, 4 x dim) activation, then lin2's own quantization of it:
the row's amax, the scale and the cast, which inductor builds as a looped reduction that reads
the activation twice. The bf16 stack instead keeps the GELU in lin1's cuBLASLt epilogue, which
a scaled fp8 or int8 GEMM does not offer. This kernel reads lin1's output once, holds each row in
registers, and writes only the quantized row and its scale, which go straight into lin2's GEMM
(:func:`quantized_linear`: the `torch._scaled_mm` / `int_scaled_matmul` calls torchao makes).

Arithmetic (the reference :func:`gelu_quantize_reference` is the same in PyTorch): the tanh GELU in
fp32, amax per row floored at ``amax_floor`` (an all-zero row would otherwise get a zero scale and
0 / 0), then

* e4m3: scale = amax / 448, the cast of ``gelu / scale`` clamped to +-448, nearest even;
* int8: scale = amax / 127.5 (torchao's symmetric convention), ``gelu / scale`` rounded to the
  nearest integer (ties to even) and clamped to [-128, 127].

Unlike torchao's quantization, the GELU output is not rounded to bf16 first and the scale stays
fp32: one rounding fewer.

Why the tanh GELU: it is the one the bf16 stack's lin1 epilogue already uses, at most 4.7e-4 from
the exact GELU, far below e4m3's rounding (up to 1/16 of a value); and it is cheap. The kernel is
compute-bound, not memory-bound, with the exact (erf) GELU; with tanh it runs near a bare cast
(docs/fp8.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samfast.kernels.dispatch import TritonKernel, interpreting, launcher, note_fallback, tl, triton, unsupported_reason

__all__ = ["QUANTIZED_DTYPES", "gelu_quantize", "gelu_quantize_reference", "quantized_linear"]

#: What each target dtype's row scale maps the row's amax to.
QMAX = {torch.float8_e4m3fn: float(torch.finfo(torch.float8_e4m3fn).max), torch.int8: 127.5}
QUANTIZED_DTYPES = tuple(QMAX)
#: Widest row held in registers (vit_h's MLP is 5120 wide).
MAX_ROW = 8192

#: Rows per program under the interpreter (no autotuning there). Tests may change it.
_INTERPRET_BLOCK_M = 4


# --------------------------------------------------------------------------- reference path


def gelu_quantize_reference(h: torch.Tensor, dtype: torch.dtype, amax_floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(gelu(h) / scale in `dtype`, scale) with one fp32 scale per row of h (..., N): scale is (..., 1).

    gelu is the tanh form, as everywhere in this module."""
    g = F.gelu(h.float(), approximate="tanh")
    scale = g.abs().amax(-1, keepdim=True).clamp(min=amax_floor) / QMAX[dtype]
    if dtype == torch.int8:
        return torch.round(g / scale).clamp(-128, 127).to(dtype), scale
    return (g / scale).clamp(-QMAX[dtype], QMAX[dtype]).to(dtype), scale


def quantized_linear(q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias for x given as quantized rows q (..., K) with fp32 row scales (..., 1).

    `weight` is torchao's rowwise Float8Tensor (e4m3 q) or Int8Tensor (int8 q): qdata (N, K) and a
    scale per output channel. On CUDA the product is the one torchao's own linear runs
    (`torch._scaled_mm` for e4m3; torchao's `int_scaled_matmul`, then the weight scale, for int8);
    elsewhere (CPU tests) the dequantized operands' product in fp32 (torchao's CPU int8 path would
    break the compiled graph). Returns bias's dtype.
    """
    out_dtype = bias.dtype if bias is not None else torch.bfloat16
    rows, row_scale = q.reshape(-1, q.shape[-1]), scale.reshape(-1, 1)
    if q.device.type != "cuda":
        out = (rows.float() * row_scale) @ (weight.qdata.float() * weight.scale.reshape(-1, 1)).t()
        out = (out if bias is None else out + bias.float()).to(out_dtype)
    elif q.dtype == torch.int8:
        from torchao.kernel.intmm import int_scaled_matmul

        out = int_scaled_matmul(rows, weight.qdata.t(), row_scale) * weight.scale.flatten()
        out = (out if bias is None else out + bias).to(out_dtype)
    else:
        out = torch._scaled_mm(
            rows, weight.qdata.t(), scale_a=row_scale, scale_b=weight.scale.t(), bias=bias, out_dtype=out_dtype
        )
    return out.view(*q.shape[:-1], out.shape[-1])


# --------------------------------------------------------------------------- the kernel


def _gelu_quantize_fwd(
    H, Q, S,
    M, N,
    stride_hm, stride_qm,
    AMAX_FLOOR: tl.constexpr,  # a constant: inductor would pass a float argument as fp64
    QMAX: tl.constexpr,
    TO_INT8: tl.constexpr,
    ROUND_IN_FP32: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    # Builtins only (tl.reduce with the standard combine, not tl.max), as in relpos_attention.py:
    # library helpers are bound to the TRITON_INTERPRET of import time.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(H + rows[:, None] * stride_hm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # tanh GELU as x * sigmoid(2 sqrt(2 / pi) (x + 0.044715 x^3)): no cancellation for x < 0
    g = x / (1.0 + tl.exp(-x * (1.5957691216057308 + 0.07135481627159915 * x * x)))  # 0 in padded columns
    amax = tl.maximum(tl.reduce(tl.abs(g), 1, tl.standard._elementwise_max), AMAX_FLOOR)
    q = g * (QMAX / amax)[:, None]
    # Adding and subtracting 1.5 x 2^23 rounds |v| < 2^22 to an integer, ties to even, as fp32
    # addition does: int8's rounding here, and the e4m3 grid's (in units of its step) below.
    if TO_INT8:
        q = tl.minimum(tl.maximum((q + 12582912.0) - 12582912.0, -128.0), 127.0)
    else:
        q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
        if ROUND_IN_FP32:
            # The interpreter's e4m3 cast does not round to nearest even (Triton's numpy emulation
            # drops the carry into the exponent), so there the value is first rounded to the e4m3
            # grid in fp32, which makes the cast exact: the step is 2^(e - 3) for a value of exponent
            # e (3 mantissa bits), 2^-9 below the smallest normal 2^-6. The GPU's cvt rounds so itself
            # (and this costs a fifth of the kernel's time there).
            exponent = tl.maximum((q.to(tl.int32, bitcast=True) >> 23) & 0xFF, 127 - 6)
            inv_step = ((257 - exponent) << 23).to(tl.float32, bitcast=True)  # 2^-(e - 3)
            step = ((exponent - 3) << 23).to(tl.float32, bitcast=True)
            q = ((q * inv_step + 12582912.0) - 12582912.0) * step
    tl.store(Q + rows[:, None] * stride_qm + cols[None, :], q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + rows, amax / QMAX, mask=rows < M)


_AUTOTUNE_CONFIGS = (
    [triton.Config({"BLOCK_M": m}, num_warps=w) for m, w in ((1, 4), (2, 4), (2, 8), (4, 8), (8, 8))]
    if triton is not None
    else []
)

_KERNEL = TritonKernel(_gelu_quantize_fwd, _AUTOTUNE_CONFIGS, key=["BLOCK_N", "TO_INT8"])


def _empty_outputs(h: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return h.new_empty(h.shape, dtype=dtype), h.new_empty(*h.shape[:-1], 1, dtype=torch.float32)


def _launch(h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, amax_floor: float) -> None:
    n = h.shape[-1]
    rows = h.view(-1, n)
    m = rows.shape[0]
    kernel, meta = _KERNEL.pick(BLOCK_M=_INTERPRET_BLOCK_M)

    def grid(meta_):
        return (triton.cdiv(m, meta_["BLOCK_M"]),)

    launcher()(kernel)[grid](
        rows, q, scale, m, n, rows.stride(0), n,
        AMAX_FLOOR=amax_floor,
        QMAX=QMAX[q.dtype],
        TO_INT8=q.dtype == torch.int8,
        ROUND_IN_FP32=interpreting(),
        BLOCK_N=triton.next_power_of_2(n),
        **meta,
    )


if triton is not None and hasattr(torch.library, "triton_op"):
    # A custom op, so torch.compile sees one node and no graph break (see relpos_attention.py).
    @torch.library.triton_op("samfast::gelu_quantize", mutates_args=())
    def _gelu_quantize_op(h: torch.Tensor, dtype: torch.dtype, amax_floor: float) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = _empty_outputs(h, dtype)
        _launch(h, q, scale, amax_floor)
        return q, scale

    @_gelu_quantize_op.register_fake
    def _(h, dtype, amax_floor):
        return _empty_outputs(h, dtype)

    def _run_kernel(h: torch.Tensor, dtype: torch.dtype, amax_floor: float) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.samfast.gelu_quantize(h, dtype, amax_floor)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable

    def _run_kernel(h: torch.Tensor, dtype: torch.dtype, amax_floor: float) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = _empty_outputs(h, dtype)
        _launch(h, q, scale, amax_floor)
        return q, scale


# --------------------------------------------------------------------------- dispatch


def _unsupported_reason(h: torch.Tensor) -> str | None:
    reason = unsupported_reason((h,))
    if reason is not None:
        return reason
    if h.shape[-1] > MAX_ROW:
        return f"rows wider than {MAX_ROW}"
    if not h.is_contiguous():
        return "a non-contiguous input"
    return None


def gelu_quantize(h: torch.Tensor, dtype: torch.dtype, amax_floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): gelu(h) (tanh form) quantized per row to `dtype` (e4m3 or int8), q * scale ~ gelu(h).

    h (..., N) -> q (..., N) of `dtype` and scale (..., 1) float32. Runs the fused kernel on CUDA
    (fp16, bf16, fp32) or under TRITON_INTERPRET=1 (fp16, fp32); otherwise
    :func:`gelu_quantize_reference`, with the reason counted in
    samfast.kernels.dispatch.FALLBACK_COUNTS.
    """
    if dtype not in QMAX:
        raise ValueError(f"gelu_quantize quantizes to {', '.join(map(str, QUANTIZED_DTYPES))}; got {dtype}")
    if h.dim() == 0 or h.shape[-1] == 0:
        raise ValueError(f"need rows to quantize, a tensor (..., N) with N > 0; got shape {tuple(h.shape)}")
    reason = _unsupported_reason(h)
    if reason is not None:
        note_fallback("gelu_quantize", reason, "the PyTorch reference")
        return gelu_quantize_reference(h, dtype, amax_floor)
    return _run_kernel(h, dtype, amax_floor)
