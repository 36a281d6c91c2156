"""The mask decoder's upscaling and mask product as one Triton kernel.

SAM turns the transformer's (P, 64, 64, 256) image tokens into masks with two 2x2 stride-2
transposed convolutions (256 -> 64 channels, layer norm, GELU; 64 -> 32, GELU) and a product with
each mask token's hypernetwork output (P, 4, 32). A 2x2 stride-2 transposed convolution maps each
input pixel to its own 2x2 output block, so the whole chain is local to one low-res pixel: its
256 channels become a 4x4 block of every mask. The kernel runs that chain per tile of pixels in
registers; the GEMM path (:func:`upscaled_masks_reference`) writes and reads the (P, 128, 128, 64)
and (P, 256, 256, 32) activations, which for segment-everything's 1024 prompts are 2 and 4 GiB
in bf16 and were ~13 ms of a ~46 ms decoder call on an H100 (docs/amg.md, session 10).

Arithmetic: fp32 accumulation and fp32 layer norm and GELU (exact, erf) inside the tile; the two
activations are rounded to the input dtype before their products, as the GEMM path rounds them.
"""

from __future__ import annotations

import torch
from torch import nn

from samfast.kernels.dispatch import interpreting, launcher, note_fallback, unsupported_reason

try:  # Triton is Linux-only; without it every call takes the counted fallback.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["upscaled_masks", "upscaled_masks_reference"]

MAX_MASKS = 16  # the mask product is one tensor-core product padded to 16 masks

#: Pixels per program under the interpreter (no autotuning there). Tests may change it.
_INTERPRET_BLOCK_N = 16


# --------------------------------------------------------------------------- reference path


def upscaled_masks_reference(src: torch.Tensor, upscaling: nn.Sequential, hyper_in: torch.Tensor) -> torch.Tensor:
    """SAM's output_upscaling and mask product on channels-last (P, h, w, C) tokens, as matrix multiplies.

    A 2x2 stride-2 transposed convolution is one GEMM per input pixel (C_in -> C_out x 2 x 2)
    followed by placing the 4 outputs in their 2x2 block. cuDNN ran the two of them on NCHW
    bf16 in 8.8 ms of a decoder call over 1024 AMG prompts on an H100, and the transformer's
    tokens are already channels-last, so the NCHW transpose goes too: 4-5 ms off that call
    (docs/amg.md, session 10). Same weights, same products up to the order of summation.
    Returns (P, M, 4h, 4w) for hyper_in (P, M, C / 8).
    """
    conv1, norm, act1, conv2, act2 = upscaling
    x = act1(norm(_conv_transpose_2x2(src, conv1), channels_last=True))
    x = act2(_conv_transpose_2x2(x, conv2))  # (P, 4h, 4w, C / 8)
    p, h4, w4, c8 = x.shape
    return (hyper_in @ x.view(p, h4 * w4, c8).transpose(1, 2)).view(p, -1, h4, w4)


def _conv_transpose_2x2(x: torch.Tensor, conv: nn.ConvTranspose2d) -> torch.Tensor:
    """conv (kernel 2, stride 2) of channels-last x (P, h, w, C_in) -> channels-last (P, 2h, 2w, C_out)."""
    p, h, w, _ = x.shape
    c_out = conv.out_channels
    # weight (C_in, C_out, 2, 2): out[2i + a, 2j + b] = x[i, j] @ weight[:, :, a, b] + bias
    y = x @ conv.weight.flatten(1)  # (P, h, w, C_out * 4) in (C_out, a, b) order
    y = y.view(p, h, w, c_out, 2, 2).permute(0, 1, 4, 2, 5, 3).reshape(p, 2 * h, 2 * w, c_out)
    return y + conv.bias


# --------------------------------------------------------------------------- the kernel


def _upscale_masks_fwd(
    X, W1, B1, G, BETA, W2, B2, HYP, Out,
    stride_xp, stride_xi, stride_xj, stride_xc,
    stride_w1i, stride_w1o, stride_w1a, stride_w1b,
    stride_w2i, stride_w2o, stride_w2a, stride_w2b,
    stride_hp, stride_hm, stride_hc,
    stride_op, stride_om, stride_oy, stride_ox,
    GRID_W,
    NUM_PIXELS,
    EPS: tl.constexpr,
    C: tl.constexpr,  # input channels (256)
    C1: tl.constexpr,  # after the first transposed conv (64)
    C2: tl.constexpr,  # after the second (32)
    M: tl.constexpr,  # masks (4)
    M_PAD: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Builtins only (tl.reduce with the standard combine, not tl.sum), as in relpos_attention.py:
    # library helpers are bound to the TRITON_INTERPRET of import time.
    pid_n = tl.program_id(0)
    p = tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < NUM_PIXELS
    row, col = offs_n // GRID_W, offs_n % GRID_W
    offs_c = tl.arange(0, C)
    offs_c1 = tl.arange(0, C1)
    offs_c2 = tl.arange(0, C2)
    offs_m = tl.arange(0, M_PAD)
    m_mask = offs_m < M

    x = tl.load(
        X + p * stride_xp + row[:, None] * stride_xi + col[:, None] * stride_xj + offs_c[None, :] * stride_xc,
        mask=n_mask[:, None],
        other=0.0,
    )
    b1 = tl.load(B1 + offs_c1).to(tl.float32)
    gamma = tl.load(G + offs_c1).to(tl.float32)
    beta = tl.load(BETA + offs_c1).to(tl.float32)
    b2 = tl.load(B2 + offs_c2).to(tl.float32)
    hyper = tl.load(  # (M_PAD, C2), rows past M zero
        HYP + p * stride_hp + offs_m[:, None] * stride_hm + offs_c2[None, :] * stride_hc,
        mask=m_mask[:, None],
        other=0.0,
    )
    out_base = Out + p * stride_op + offs_m[None, :] * stride_om
    store_mask = n_mask[:, None] & m_mask[None, :]

    for a in tl.static_range(2):
        for b in tl.static_range(2):
            # first transposed conv, sub-pixel (a, b): (BLOCK_N, C) @ (C, C1)
            w1 = tl.load(W1 + offs_c[:, None] * stride_w1i + offs_c1[None, :] * stride_w1o + a * stride_w1a + b * stride_w1b)
            if IEEE:
                y = tl.dot(x, w1, input_precision="ieee")
            else:
                y = tl.dot(x, w1)
            y = y + b1[None, :]
            mean = tl.reduce(y, 1, tl.standard._sum_combine) / C1
            centred = y - mean[:, None]
            var = tl.reduce(centred * centred, 1, tl.standard._sum_combine) / C1
            y = centred * tl.math.rsqrt(var + EPS)[:, None] * gamma[None, :] + beta[None, :]
            y = (0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))).to(x.dtype)
            for c in tl.static_range(2):
                for d in tl.static_range(2):
                    w2 = tl.load(
                        W2 + offs_c1[:, None] * stride_w2i + offs_c2[None, :] * stride_w2o + c * stride_w2a + d * stride_w2b
                    )
                    if IEEE:
                        z = tl.dot(y, w2, input_precision="ieee")
                    else:
                        z = tl.dot(y, w2)
                    z = z + b2[None, :]
                    z = (0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))).to(x.dtype)
                    if IEEE:
                        masks = tl.dot(z, tl.trans(hyper), input_precision="ieee")  # (BLOCK_N, M_PAD)
                    else:
                        masks = tl.dot(z, tl.trans(hyper))
                    out_row = 4 * row + 2 * a + c
                    out_col = 4 * col + 2 * b + d
                    tl.store(
                        out_base + out_row[:, None] * stride_oy + out_col[:, None] * stride_ox,
                        masks.to(Out.dtype.element_ty),
                        mask=store_mask,
                    )


_AUTOTUNE_CONFIGS = (
    [
        triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=2),
        triton.Config({"BLOCK_N": 64}, num_warps=8, num_stages=2),
        triton.Config({"BLOCK_N": 128}, num_warps=8, num_stages=2),
        triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=2),
    ]
    if triton is not None
    else []
)

if triton is not None:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    # Built explicitly, as in relpos_attention.py: compiled or interpreted is chosen per call.
    _compiled_kernel = triton.autotune(configs=_AUTOTUNE_CONFIGS, key=["C", "C1", "C2", "M"])(
        JITFunction(_upscale_masks_fwd)
    )
    _interpreted_kernel = InterpretedFunction(_upscale_masks_fwd)
else:  # pragma: no cover
    _compiled_kernel = _interpreted_kernel = None


def _empty_out(src: torch.Tensor, hyper_in: torch.Tensor) -> torch.Tensor:
    p, h, w, _ = src.shape
    return src.new_empty(p, hyper_in.shape[1], 4 * h, 4 * w)


def _launch(src, w1, b1, gamma, beta, w2, b2, hyper_in, out, eps: float) -> None:
    p, h, w, c = src.shape
    if interpreting():
        kernel, meta = _interpreted_kernel, {"BLOCK_N": _INTERPRET_BLOCK_N}
    else:
        kernel, meta = _compiled_kernel, {}

    def grid(m):
        return (triton.cdiv(h * w, m["BLOCK_N"]), p)

    launcher()(kernel)[grid](
        src, w1, b1, gamma, beta, w2, b2, hyper_in, out,
        *src.stride(), *w1.stride(), *w2.stride(), *hyper_in.stride(), *out.stride(),
        w,
        h * w,
        EPS=eps,
        C=c,
        C1=w1.shape[1],
        C2=w2.shape[1],
        M=hyper_in.shape[1],
        M_PAD=MAX_MASKS,
        IEEE=src.dtype == torch.float32,
        **meta,
    )


if triton is not None and hasattr(torch.library, "triton_op"):
    # A custom op, so torch.compile sees one node and no graph break (see relpos_attention.py).
    @torch.library.triton_op("samfast::upscaled_masks", mutates_args=())
    def _upscaled_masks_op(
        src: torch.Tensor,
        w1: torch.Tensor,
        b1: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor,
        w2: torch.Tensor,
        b2: torch.Tensor,
        hyper_in: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:
        out = _empty_out(src, hyper_in)
        _launch(src, w1, b1, gamma, beta, w2, b2, hyper_in, out, eps)
        return out

    @_upscaled_masks_op.register_fake
    def _(src, w1, b1, gamma, beta, w2, b2, hyper_in, eps):
        return _empty_out(src, hyper_in)

    def _run_kernel(*args):
        return torch.ops.samfast.upscaled_masks(*args)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable

    def _run_kernel(src, w1, b1, gamma, beta, w2, b2, hyper_in, eps):
        out = _empty_out(src, hyper_in)
        _launch(src, w1, b1, gamma, beta, w2, b2, hyper_in, out, eps)
        return out


# --------------------------------------------------------------------------- dispatch


def _is_pow2_at_least_16(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def _unsupported_reason(src, upscaling, hyper_in) -> str | None:
    conv1, norm, act1, conv2, act2 = upscaling
    params = (conv1.weight, conv1.bias, norm.weight, norm.bias, conv2.weight, conv2.bias)
    reason = unsupported_reason((src, hyper_in, *params))
    if reason is not None:
        return reason
    if not all(_is_pow2_at_least_16(n) for n in (src.shape[-1], conv1.out_channels, conv2.out_channels)):
        return "channel counts not powers of 2 >= 16"
    if hyper_in.shape[1] > MAX_MASKS:
        return f"more than {MAX_MASKS} masks"
    if any(conv.kernel_size != (2, 2) or conv.stride != (2, 2) for conv in (conv1, conv2)):
        return "transposed convolutions other than 2x2 stride 2"
    if any(not isinstance(act, nn.GELU) or act.approximate != "none" for act in (act1, act2)):
        return "activations other than the exact GELU"
    return None


def upscaled_masks(src: torch.Tensor, upscaling: nn.Sequential, hyper_in: torch.Tensor) -> torch.Tensor:
    """Masks (P, M, 4h, 4w) from channels-last tokens src (P, h, w, C) and hyper_in (P, M, C / 8).

    `upscaling` is SAM's output_upscaling (transposed conv, LayerNorm2d, GELU, transposed conv,
    GELU). Runs the fused kernel on CUDA (fp16, bf16, fp32) or under TRITON_INTERPRET=1 (fp16,
    fp32); otherwise :func:`upscaled_masks_reference`, with the reason counted in
    samfast.kernels.dispatch.FALLBACK_COUNTS.
    """
    conv1, conv2 = upscaling[0], upscaling[3]
    if src.dim() != 4 or src.shape[-1] != conv1.in_channels or hyper_in.shape != (
        src.shape[0], hyper_in.shape[1], conv2.out_channels
    ):
        raise ValueError(
            f"need src (P, h, w, {conv1.in_channels}) and hyper_in (P, masks, {conv2.out_channels}) for this "
            f"upscaling; got {tuple(src.shape)} and {tuple(hyper_in.shape)}"
        )
    reason = _unsupported_reason(src, upscaling, hyper_in)
    if reason is not None:
        note_fallback("upscaled_masks", reason, "the GEMM reference path")
        return upscaled_masks_reference(src, upscaling, hyper_in)
    norm = upscaling[1]
    return _run_kernel(
        src, conv1.weight, conv1.bias, norm.weight, norm.bias, conv2.weight, conv2.bias, hyper_in, float(norm.eps)
    )
