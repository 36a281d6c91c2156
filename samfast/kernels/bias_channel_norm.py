"""Hiera's first layer norm of a block, with a channel of ones after it that the next GEMMs use for their bias.

On Hiera-L's first two stages cuBLASLt's bias epilogue picks slow kernels for these narrow GEMMs
(measured: docs/history/figures-from-docstrings.md). Given x with a channel of ones (and zeros up to a
multiple of 8 channels, 16-byte rows), the bias can be that channel's weight column
(samfast.modeling.common.linear_with_bias_channel). Inductor
wrote the constant channels in extra strided passes, or as a looped reduction twice as slow as its layer
norm, which cost what the GEMMs saved (docs/measurements/sam2-encoder/bias-epilogue-h200-2026-11-29.md). This kernel
writes them in the norm's own pass: a program holds BLOCK_M rows of the residual stream in registers,
adds the stream's deferred bias (Hiera.forward_windowed), normalizes, applies the affine and writes
each row once, C + bias_channels(C) wide.

Arithmetic: fp32 from the loads on, the two-pass mean and variance, one rounding to the input dtype at
the end, as inductor's layer norm of a bf16 input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samfast.kernels.dispatch import TritonKernel, launcher, note_fallback, tl, triton, unsupported_reason

__all__ = ["MAX_CHANNELS", "bias_channels", "norm_with_bias_channel", "norm_with_bias_channel_reference"]

#: Rows per program under the interpreter (no autotuning there). Tests may change it.
_INTERPRET_BLOCK_M = 64

#: The widest row the kernel holds in registers (the rule that picks its blocks stops at 288).
MAX_CHANNELS = 1024


def bias_channels(channels: int) -> int:
    """How many channels the norm adds: the ones, then zeros up to a multiple of 8."""
    return (-(channels + 1)) % 8 + 1


def norm_with_bias_channel_reference(
    x: torch.Tensor, residual_bias: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """[layer_norm(x + residual_bias), 1, 0, ...] along the last dimension, contiguous."""
    y = F.layer_norm(x + residual_bias, x.shape[-1:], weight, bias, eps)
    extra = bias_channels(x.shape[-1])
    return torch.cat([y, y.new_ones(*y.shape[:-1], 1), y.new_zeros(*y.shape[:-1], extra - 1)], dim=-1)


def _norm_with_bias_channel_fwd(
    X, ResidualBias, W, B, Out,
    M,
    eps,
    C: tl.constexpr,
    WIDE: tl.constexpr,  # C + bias_channels(C): the output's row
    BLOCK_C: tl.constexpr,  # the next power of 2 of WIDE
    BLOCK_M: tl.constexpr,
):
    # Builtins only (tl.reduce with the standard combine, not tl.sum), as in relpos_attention.py
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_C)
    in_rows = rows < M
    real = cols < C
    x = tl.load(X + rows[:, None] * C + cols[None, :], mask=in_rows[:, None] & real[None, :], other=0.0).to(tl.float32)
    x += tl.load(ResidualBias + cols, mask=real, other=0.0).to(tl.float32)[None, :]
    mean = tl.reduce(x, 1, tl.standard._sum_combine) / C
    centered = tl.where(real[None, :], x - mean[:, None], 0.0)
    variance = tl.reduce(centered * centered, 1, tl.standard._sum_combine) / C
    # Inside a compiled graph eps arrives as fp64 (inductor types Python floats so): cast it, or the row's
    # math promotes to fp64 (test_kernel_scalar_types.py; what it cost: docs/history/figures-from-docstrings.md)
    y = centered * tl.rsqrt(variance + tl.cast(eps, tl.float32))[:, None]
    y = y * tl.load(W + cols, mask=real, other=0.0).to(tl.float32)[None, :] + tl.load(B + cols, mask=real, other=0.0).to(tl.float32)[None, :]
    y = tl.where((cols == C)[None, :], 1.0, y)  # the ones; the channels after it are 0
    tl.store(Out + rows[:, None] * WIDE + cols[None, :], y.to(Out.dtype.element_ty),
             mask=in_rows[:, None] & (cols < WIDE)[None, :])


# Few warps a program: at 144 and 288 channels the kernel is fastest with a row or a few per warp
# (measured: docs/history/figures-from-docstrings.md). The neighbours stay for other GPUs.
_CONFIGS = (
    [triton.Config({"BLOCK_M": m}, num_warps=w) for m, w in ((2, 1), (4, 1), (8, 1), (4, 2), (8, 2), (32, 2), (16, 4), (32, 4))]
    if triton is not None
    else []
)
_KERNEL = TritonKernel(_norm_with_bias_channel_fwd, _CONFIGS, key=["C"])


def _new_output(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], x.shape[-1] + bias_channels(x.shape[-1]))


def _norm_kernel(x, residual_bias, weight, bias, eps: float) -> torch.Tensor:
    out = _new_output(x)
    c = x.shape[-1]
    rows = x.numel() // c
    kernel, meta = _KERNEL.pick(BLOCK_M=_INTERPRET_BLOCK_M)

    def grid(meta_):
        return (triton.cdiv(rows, meta_["BLOCK_M"]),)

    launcher()(kernel)[grid](
        x, residual_bias, weight, bias, out,
        rows,
        eps,
        C=c,
        WIDE=out.shape[-1],
        BLOCK_C=triton.next_power_of_2(out.shape[-1]),
        **meta,
    )
    return out


if triton is not None and hasattr(torch.library, "triton_op"):
    # A custom op, so torch.compile sees one node and no graph break (see relpos_attention.py).
    @torch.library.triton_op("samfast::norm_with_bias_channel", mutates_args=())
    def _norm_op(x: torch.Tensor, residual_bias: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return _norm_kernel(x, residual_bias, weight, bias, eps)

    @_norm_op.register_fake
    def _(x, residual_bias, weight, bias, eps):
        return _new_output(x)

    def _run(x, residual_bias, weight, bias, eps):
        return torch.ops.samfast.norm_with_bias_channel(x, residual_bias, weight, bias, eps)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable
    _run = _norm_kernel


def norm_with_bias_channel(
    x: torch.Tensor, residual_bias: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """[layer_norm(x + residual_bias), 1, 0, ...]: x (..., C), the norm over its C channels with weight, bias
    and eps; (..., C + bias_channels(C)), contiguous.

    Runs the kernel on CUDA (fp16, bf16, fp32) or under TRITON_INTERPRET=1 (fp16, fp32) for a contiguous x
    of at most MAX_CHANNELS channels; otherwise :func:`norm_with_bias_channel_reference`, the reason counted
    in samfast.kernels.dispatch.
    """
    c = x.shape[-1]
    if any(t.shape != (c,) for t in (residual_bias, weight, bias)):
        raise ValueError(f"norm_with_bias_channel takes x (..., C) and a residual bias, norm weight and norm bias of "
                         f"(C,); got {tuple(x.shape)}, {tuple(residual_bias.shape)}, {tuple(weight.shape)}, {tuple(bias.shape)}")
    reason = unsupported_reason((x, residual_bias, weight, bias))
    if reason is None and c > MAX_CHANNELS:
        reason = f"more than {MAX_CHANNELS} channels"
    if reason is None and not x.is_contiguous():
        reason = "a norm input that is not contiguous"
    if reason is not None:
        note_fallback("norm_with_bias_channel", reason, "the layer norm and a concatenation")
        return norm_with_bias_channel_reference(x, residual_bias, weight, bias, eps)
    return _run(x, residual_bias, weight, bias, eps)
