"""SAM 2's mask downsampler: its first stride-2 3x3 convs, each with its LayerNorm2d and GELU, in one Triton kernel.

The memory encoder turns each object's 1024 x 1024 mask into the 64 x 64 map with four convs (1 -> 4
-> 16 -> 64 -> 256 channels, kernel 3, stride 2, padding 1), each followed by a LayerNorm over the
channels and a GELU. For the first convs' one and four input channels cuDNN ran its generic grouped
kernels, and the norms and GELUs were extra passes
(docs/measurements/video/video-profile-h200-hiera_l-objects-rotated-keys-2026-11-28.md). Here a program takes
BLOCK_P output pixels of one map, channels-last: for each of the 9 taps and each input channel it loads
the pixels under the tap (zeros outside the map) and adds their products with that tap's COUT weights,
then adds the bias, normalizes over the COUT channels, applies the norm's affine and the exact (erf) GELU
and writes the pixels once.

Arithmetic: fp32 accumulation, norm and GELU, one rounding to the input dtype at the end (the module
path rounds after the conv, the norm and the GELU each).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samfast.kernels.dispatch import TritonKernel, is_power_of_2, launcher, note_fallback, tl, triton, unsupported_reason

__all__ = ["MAX_INPUT_CHANNELS", "downsample_conv", "downsample_conv_reference"]

#: Output pixels per program under the interpreter (no autotuning there): many, since the interpreter's
#: cost is per program (the nano's three 256 x 256 masks: 43 s a call at 32 pixels, 0.4 s at 4096).
#: Tests may change it.
_INTERPRET_BLOCK_P = 4096

#: The most input channels the kernel takes. It sums each tap's products channel by channel, which
#: pays for the first convs' 1 and 4 channels; from 16 on cuDNN's implicit GEMMs serve (a tl.dot version
#: compiled too long and ran slower: docs/history/figures-from-docstrings.md).
MAX_INPUT_CHANNELS = 8


def downsample_conv_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """gelu(layer_norm(conv2d(x, weight, bias, stride 2, padding 1))) of a channels-last map x (B, H, W, C):
    the module path (MaskDownSampler's Conv2d, LayerNorm2d, GELU), channels-last (B, H / 2, W / 2, COUT)."""
    y = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, stride=2, padding=1).permute(0, 2, 3, 1)
    u = y.mean(-1, keepdim=True)
    s = (y - u).pow(2).mean(-1, keepdim=True)
    return F.gelu(norm_weight * ((y - u) / torch.sqrt(s + eps)) + norm_bias)


def _downsample_conv_fwd(
    X, W, Bias, NormW, NormB, Out,
    stride_xb, stride_xh, stride_xw, stride_xc,
    H, W_IN, HO, WO,
    eps,
    C: tl.constexpr,  # input channels, few: each tap's products are summed channel by channel
    COUT: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    # one program: BLOCK_P output pixels of one map (row-major over HO x WO). Builtins only (tl.full, tl.reduce
    # with the standard combine, not tl.zeros / tl.sum), as in relpos_attention.py
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    pixel = pid * BLOCK_P + tl.arange(0, BLOCK_P)
    valid = pixel < HO * WO
    oy, ox = pixel // WO, pixel % WO
    offs_o = tl.arange(0, COUT)
    acc = tl.full([BLOCK_P, COUT], 0.0, dtype=tl.float32)
    for dy in tl.static_range(3):
        iy = 2 * oy - 1 + dy
        for dx in tl.static_range(3):
            ix = 2 * ox - 1 + dx
            inside = valid & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W_IN)
            under = X + b * stride_xb + iy * stride_xh + ix * stride_xw
            for c in tl.static_range(C):
                x = tl.load(under + c * stride_xc, mask=inside, other=0.0).to(tl.float32)
                # weight (COUT, C, 3, 3), contiguous: this tap's weights of input channel c
                w = tl.load(W + offs_o * (C * 9) + (c * 9 + dy * 3 + dx)).to(tl.float32)
                acc += x[:, None] * w[None, :]
    acc += tl.load(Bias + offs_o).to(tl.float32)[None, :]
    mean = tl.reduce(acc, 1, tl.standard._sum_combine) / COUT
    centered = acc - mean[:, None]
    variance = tl.reduce(centered * centered, 1, tl.standard._sum_combine) / COUT
    # eps cast to fp32: inside a compiled graph it arrives as fp64 (see bias_channel_norm.py)
    y = centered * tl.rsqrt(variance + tl.cast(eps, tl.float32))[:, None]
    y = y * tl.load(NormW + offs_o).to(tl.float32)[None, :] + tl.load(NormB + offs_o).to(tl.float32)[None, :]
    y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
    tl.store(Out + b * (HO * WO * COUT) + pixel[:, None] * COUT + offs_o[None, :], y.to(Out.dtype.element_ty),
             mask=valid[:, None])


_CONFIGS = (
    [triton.Config({"BLOCK_P": p}, num_warps=w, num_stages=2) for p, w in ((64, 4), (128, 4), (256, 8))]
    if triton is not None
    else []
)
_KERNEL = TritonKernel(_downsample_conv_fwd, _CONFIGS, key=["C", "COUT"])


def _new_output(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    b, h, w, _ = x.shape
    return x.new_empty(b, (h + 1) // 2, (w + 1) // 2, weight.shape[0])


def _downsample_conv_kernel(x, weight, bias, norm_weight, norm_bias, eps: float) -> torch.Tensor:
    out = _new_output(x, weight)
    b, h, w, c = x.shape
    ho, wo = out.shape[1], out.shape[2]
    kernel, meta = _KERNEL.pick(BLOCK_P=_INTERPRET_BLOCK_P)

    def grid(meta_):
        return (triton.cdiv(ho * wo, meta_["BLOCK_P"]), b)

    launcher()(kernel)[grid](
        x, weight, bias, norm_weight, norm_bias, out,
        *x.stride(),
        h, w, ho, wo,
        eps,
        C=c,
        COUT=weight.shape[0],
        **meta,
    )
    return out


if triton is not None and hasattr(torch.library, "triton_op"):
    # A custom op, so torch.compile sees one node and no graph break (see relpos_attention.py).
    @torch.library.triton_op("samfast::downsample_conv", mutates_args=())
    def _downsample_conv_op(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:
        return _downsample_conv_kernel(x, weight, bias, norm_weight, norm_bias, eps)

    @_downsample_conv_op.register_fake
    def _(x, weight, bias, norm_weight, norm_bias, eps):
        return _new_output(x, weight)

    def _run(x, weight, bias, norm_weight, norm_bias, eps):
        return torch.ops.samfast.downsample_conv(x, weight, bias, norm_weight, norm_bias, eps)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable
    _run = _downsample_conv_kernel


def downsample_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """gelu(layer_norm(conv2d(x, weight (COUT, C, 3, 3), bias, stride 2, padding 1))) of a channels-last
    map x (B, H, W, C), any strides (an NCHW mask with one channel is one: its permute), the norm over
    the COUT channels with norm_weight, norm_bias and eps; channels-last (B, ceil(H / 2), ceil(W / 2), COUT),
    contiguous.

    Runs the kernel on CUDA (fp16, bf16, fp32) or under TRITON_INTERPRET=1 (fp16, fp32) for C and COUT
    powers of 2, C at most MAX_INPUT_CHANNELS; otherwise :func:`downsample_conv_reference`, the reason
    counted in samfast.kernels.dispatch.
    """
    cout = weight.shape[0]
    if x.dim() != 4 or weight.shape != (cout, x.shape[3], 3, 3) or any(t.shape != (cout,) for t in (bias, norm_weight, norm_bias)):
        raise ValueError(f"downsample_conv takes x (B, H, W, C), weight (COUT, C, 3, 3) and bias, norm weight and "
                         f"norm bias (COUT,); got {tuple(x.shape)}, {tuple(weight.shape)}, {tuple(bias.shape)}, "
                         f"{tuple(norm_weight.shape)}, {tuple(norm_bias.shape)}")
    reason = unsupported_reason((x, weight, bias, norm_weight, norm_bias))
    channels = x.shape[3]
    if reason is None and not (is_power_of_2(channels) and channels <= MAX_INPUT_CHANNELS and is_power_of_2(cout)):
        reason = f"conv channels not powers of 2 (the inputs at most {MAX_INPUT_CHANNELS})"
    if reason is None and not weight.is_contiguous():
        reason = "a conv weight that is not contiguous"
    if reason is not None:
        note_fallback("downsample_conv", reason, "the conv, norm and GELU apart")
        return downsample_conv_reference(x, weight, bias, norm_weight, norm_bias, eps)
    return _run(x, weight, bias, norm_weight, norm_bias, eps)
