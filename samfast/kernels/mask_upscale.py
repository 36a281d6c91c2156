"""The mask decoder's upscaling and mask product: one GEMM and one fused Triton kernel.

SAM turns the transformer's (P, 64, 64, 256) image tokens into masks with two 2x2 stride-2
transposed convolutions (256 -> 64 channels, layer norm, GELU; 64 -> 32, GELU) and a product with
each mask token's hypernetwork output (P, 4, 32). A 2x2 stride-2 transposed convolution maps each
input pixel to its own 2x2 output block, so after the first one every (pixel, sub-pixel) row of 64
channels is independent: its layer norm, GELU, the second convolution (all four of its sub-pixels
at once, 64 -> 4 x 32), GELU and the mask product (a block-diagonal product with the hypernetwork
outputs, 4 x 32 -> 4 x masks) run in registers, and only the masks are written. The GEMM path
(:func:`upscaled_masks_reference`) writes and reads the (P, 128, 128, 64) and (P, 256, 256, 32)
activations, 2 and 4 GiB in bf16 for segment-everything's 1024 prompts.

This path is faster than the GEMM path compiled by inductor; a kernel doing the first convolution as
well was slower: cuBLAS does that GEMM best (docs/amg.md, the fused upscaling of commit 40073d9).

Arithmetic: fp32 accumulation, layer norm and GELU (exact, erf); the first convolution's output and
the activations are rounded to the input dtype before their products, as the GEMM path rounds them.
"""

from __future__ import annotations

import torch
from torch import nn

from samfast.kernels.dispatch import TritonKernel, dot_precision, is_power_of_2, launcher, note_fallback, tl, triton, unsupported_reason

__all__ = ["upscaled_masks", "upscaled_masks_reference"]

MAX_MASKS = 4  # the mask product of a row's 4 sub-pixels is one tensor-core product, 4 x masks wide

#: Rows per program under the interpreter (no autotuning there). Tests may change it.
_INTERPRET_BLOCK_R = 64


# --------------------------------------------------------------------------- reference path


def upscaled_masks_reference(
    src: torch.Tensor, upscaling: nn.Sequential, hyper_in: torch.Tensor, high_res: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """SAM's output_upscaling and mask product on channels-last (P, h, w, C) tokens, as matrix multiplies.

    A 2x2 stride-2 transposed convolution is one GEMM per input pixel (C_in -> C_out x 2 x 2)
    followed by placing the 4 outputs in their 2x2 block. cuDNN ran the two of them on NCHW,
    and the transformer's tokens are already channels-last, so the NCHW transpose goes too
    (docs/amg.md, the upscaling as GEMMs, commit 355f977). Same weights, same products up to the order of summation.
    Returns (P, M, 4h, 4w) for hyper_in (P, M, C / 8). high_res: SAM 2's stride-8 and stride-4 levels
    per prompt, channels-last (P, 2h, 2w, C / 4) and (P, 4h, 4w, C / 8), added to the first and second
    convolutions' outputs (before the layer norm and the second GELU), as sam2's decoder adds them.
    """
    conv1, norm, act1, conv2, act2 = upscaling
    feat_s1, feat_s0 = high_res if high_res is not None else (0.0, 0.0)
    x = act1(norm(_conv_transpose_2x2(src, conv1) + feat_s1, channels_last=True))
    x = act2(_conv_transpose_2x2(x, conv2) + feat_s0)  # (P, 4h, 4w, C / 8)
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
    Y, B1, G, BETA, W2, B2, HBD, Out,
    S1, S0, IMAGE,  # SAM 2's high-resolution levels per image, channels-last, and each prompt's image
    stride_hp, stride_hk, stride_ht,
    stride_op, stride_om, stride_oy, stride_ox,
    GRID_W,
    ROWS_PER_PROMPT,  # 4 sub-pixels x h x w
    HIGH_RES: tl.constexpr,  # add S1 before the layer norm and S0 before the second GELU (SAM 2)
    EPS: tl.constexpr,
    C1: tl.constexpr,  # channels after the first transposed conv (64)
    N2: tl.constexpr,  # 4 sub-pixels x channels after the second (4 x 32)
    M: tl.constexpr,  # masks (4)
    MT: tl.constexpr,  # 4 sub-pixels x masks, padded to >= 16
    PRECISION: tl.constexpr,  # tl.dot's input_precision (dispatch.dot_precision)
    BLOCK_R: tl.constexpr,
):
    # Builtins only (tl.reduce with the standard combine, not tl.sum), as in relpos_attention.py:
    # library helpers are bound to the TRITON_INTERPRET of import time.
    pid_r = tl.program_id(0)
    p = tl.program_id(1).to(tl.int64)
    local = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)  # row = (pixel, sub-pixel a, b) of this prompt
    r_mask = local < ROWS_PER_PROMPT
    pixel, sub = local // 4, local % 4
    row, col = pixel // GRID_W, pixel % GRID_W
    offs_c1 = tl.arange(0, C1)
    offs_n2 = tl.arange(0, N2)
    offs_t = tl.arange(0, MT)

    y = tl.load(Y + (p * ROWS_PER_PROMPT + local)[:, None] * C1 + offs_c1[None, :], mask=r_mask[:, None], other=0.0)
    y = y.to(tl.float32) + tl.load(B1 + offs_c1).to(tl.float32)[None, :]
    if HIGH_RES:
        image = tl.load(IMAGE + p).to(tl.int64)
        # the stride-8 level (2h, 2w, C1) at this row's sub-pixel (a, b) = (sub // 2, sub % 2)
        s1_pixel = (2 * row + sub // 2) * (2 * GRID_W) + 2 * col + sub % 2
        s1 = tl.load(S1 + image * ROWS_PER_PROMPT * C1 + s1_pixel[:, None] * C1 + offs_c1[None, :],
                     mask=r_mask[:, None], other=0.0)
        y = y + s1.to(tl.float32)
    mean = tl.reduce(y, 1, tl.standard._sum_combine) / C1
    centred = y - mean[:, None]
    var = tl.reduce(centred * centred, 1, tl.standard._sum_combine) / C1
    gamma = tl.load(G + offs_c1).to(tl.float32)
    beta = tl.load(BETA + offs_c1).to(tl.float32)
    y = centred * tl.math.rsqrt(var + EPS)[:, None] * gamma[None, :] + beta[None, :]
    y = (0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))).to(Y.dtype.element_ty)

    # second transposed conv, its 4 sub-pixels (c, d) at once: (BLOCK_R, C1) @ (C1, 4 x C2)
    w2 = tl.load(W2 + offs_c1[:, None] * N2 + offs_n2[None, :])
    z = tl.dot(y, w2, input_precision=PRECISION)
    z = z + tl.load(B2 + offs_n2).to(tl.float32)[None, :]
    if HIGH_RES:
        # the stride-4 level (4h, 4w, C2) at column (c, d, k)'s output pixel
        C2: tl.constexpr = N2 // 4
        cd2, k2 = offs_n2 // C2, offs_n2 % C2
        s0_y = 4 * row[:, None] + 2 * (sub // 2)[:, None] + (cd2 // 2)[None, :]
        s0_x = 4 * col[:, None] + 2 * (sub % 2)[:, None] + (cd2 % 2)[None, :]
        s0 = tl.load(S0 + image * ROWS_PER_PROMPT * N2 + (s0_y * (4 * GRID_W) + s0_x) * C2 + k2[None, :],
                     mask=r_mask[:, None], other=0.0)
        z = z + s0.to(tl.float32)
    z = (0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))).to(Y.dtype.element_ty)

    # mask product, block-diagonal over the sub-pixels: column t = (c, d, mask)
    hbd = tl.load(HBD + p * stride_hp + offs_n2[:, None] * stride_hk + offs_t[None, :] * stride_ht)
    masks = tl.dot(z, hbd, input_precision=PRECISION)
    cd, m = offs_t // M, offs_t % M
    out_row = 4 * row[:, None] + 2 * (sub // 2)[:, None] + (cd // 2)[None, :]
    out_col = 4 * col[:, None] + 2 * (sub % 2)[:, None] + (cd % 2)[None, :]
    tl.store(
        Out + p * stride_op + m[None, :] * stride_om + out_row * stride_oy + out_col * stride_ox,
        masks.to(Out.dtype.element_ty),
        mask=r_mask[:, None] & (offs_t < 4 * M)[None, :],
    )


# Not BLOCK_R 64 with 4 warps: Triton 3.6 builds that one with an out-of-bounds shared-memory read in
# the final store's layout change (compute-sanitizer on an H100, commit 45c2a1a; the configs here pass it).
_AUTOTUNE_CONFIGS = (
    [triton.Config({"BLOCK_R": r}, num_warps=w, num_stages=2) for r, w in ((128, 4), (128, 8), (256, 8))]
    if triton is not None
    else []
)

_KERNEL = TritonKernel(_upscale_masks_fwd, _AUTOTUNE_CONFIGS, key=["C1", "N2", "M"])


def _empty_out(src: torch.Tensor, hyper_in: torch.Tensor) -> torch.Tensor:
    p, h, w, _ = src.shape
    return src.new_empty(p, hyper_in.shape[1], 4 * h, 4 * w)


def _launch(src, w1, b1, gamma, beta, w2, b2, hyper_in, out, eps: float, s1=None, s0=None, image=None) -> None:
    """s1, s0, image: SAM 2's high-resolution levels, channels-last contiguous (N, 2h, 2w, C1) and
    (N, 4h, 4w, C2), and the image (P,) int64 of each prompt; all None for SAM 1."""
    p, h, w, c = src.shape
    c1, c2, m = w1.shape[1], w2.shape[1], hyper_in.shape[1]
    # the first transposed conv as one GEMM, columns in (a, b, C1) order: its output is rows
    # (pixel, sub-pixel) of C1 channels, bias added in the kernel
    y = src.reshape(p * h * w, c) @ w1.permute(0, 2, 3, 1).reshape(c, 4 * c1)
    w2_all = w2.permute(0, 2, 3, 1).reshape(c1, 4 * c2).contiguous()  # columns (c, d, C2)
    mt = max(16, 4 * m)
    # hbd[:, (c, d, k), (c, d, mask)] = hyper_in[:, mask, k]: the mask product of all 4 sub-pixels at once
    hbd = torch.block_diag(*[torch.ones(c2, m, dtype=hyper_in.dtype, device=hyper_in.device)] * 4)
    hbd = hbd * hyper_in.transpose(1, 2).repeat(1, 4, 4)
    hbd = torch.nn.functional.pad(hbd, (0, mt - 4 * m))
    kernel, meta = _KERNEL.pick(BLOCK_R=_INTERPRET_BLOCK_R)

    def grid(meta_):
        return (triton.cdiv(4 * h * w, meta_["BLOCK_R"]), p)

    high_res = s1 is not None
    launcher()(kernel)[grid](
        y, b1, gamma, beta, w2_all, b2.repeat(4), hbd, out,
        *((s1, s0, image) if high_res else (y, y, y)),  # unread without HIGH_RES
        *hbd.stride(), *out.stride(),
        w,
        4 * h * w,
        HIGH_RES=high_res,
        EPS=eps,
        C1=c1,
        N2=4 * c2,
        M=m,
        MT=mt,
        PRECISION=dot_precision(src.dtype),
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
        s1: torch.Tensor | None,
        s0: torch.Tensor | None,
        image: torch.Tensor | None,
    ) -> torch.Tensor:
        out = _empty_out(src, hyper_in)
        _launch(src, w1, b1, gamma, beta, w2, b2, hyper_in, out, eps, s1, s0, image)
        return out

    @_upscaled_masks_op.register_fake
    def _(src, w1, b1, gamma, beta, w2, b2, hyper_in, eps, s1, s0, image):
        return _empty_out(src, hyper_in)

    def _run_kernel(*args):
        return torch.ops.samfast.upscaled_masks(*args)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable

    def _run_kernel(src, w1, b1, gamma, beta, w2, b2, hyper_in, eps, s1, s0, image):
        out = _empty_out(src, hyper_in)
        _launch(src, w1, b1, gamma, beta, w2, b2, hyper_in, out, eps, s1, s0, image)
        return out


# --------------------------------------------------------------------------- dispatch


def _unsupported_reason(src, upscaling, hyper_in, high_res) -> str | None:
    conv1, norm, act1, conv2, act2 = upscaling
    params = (conv1.weight, conv1.bias, norm.weight, norm.bias, conv2.weight, conv2.bias)
    reason = unsupported_reason((src, hyper_in, *params, *high_res))
    if reason is not None:
        return reason
    if not all(is_power_of_2(n, at_least=16) for n in (conv1.out_channels, 4 * conv2.out_channels)):
        return "upscaling widths not powers of 2 >= 16"
    if hyper_in.shape[1] > MAX_MASKS:
        return f"more than {MAX_MASKS} masks"
    if any(conv.kernel_size != (2, 2) or conv.stride != (2, 2) for conv in (conv1, conv2)):
        return "transposed convolutions other than 2x2 stride 2"
    if any(not isinstance(act, nn.GELU) or act.approximate != "none" for act in (act1, act2)):
        return "activations other than the exact GELU"
    return None


def upscaled_masks(
    src: torch.Tensor,
    upscaling: nn.Sequential,
    hyper_in: torch.Tensor,
    high_res: tuple[torch.Tensor, torch.Tensor] | None = None,
    image_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masks (P, M, 4h, 4w) from channels-last tokens src (P, h, w, C) and hyper_in (P, M, C / 8).

    `upscaling` is SAM's output_upscaling (transposed conv, LayerNorm2d, GELU, transposed conv,
    GELU). high_res: SAM 2's stride-8 and stride-4 levels per image, NCHW (N, C / 4, 2h, 2w) and
    (N, C / 8, 4h, 4w), prompt p reading image image_index[p] (None: image p, or image 0 when N is 1),
    read in the kernel without a copy per prompt. Runs the fused kernel on CUDA (fp16, bf16, fp32) or
    under TRITON_INTERPRET=1 (fp16, fp32); otherwise :func:`upscaled_masks_reference`, with the
    reason counted in samfast.kernels.dispatch.FALLBACK_COUNTS.
    """
    conv1, conv2 = upscaling[0], upscaling[3]
    if src.dim() != 4 or src.shape[-1] != conv1.in_channels or hyper_in.shape != (
        src.shape[0], hyper_in.shape[1], conv2.out_channels
    ):
        raise ValueError(
            f"need src (P, h, w, {conv1.in_channels}) and hyper_in (P, masks, {conv2.out_channels}) for this "
            f"upscaling; got {tuple(src.shape)} and {tuple(hyper_in.shape)}"
        )
    p, h, w, _ = src.shape
    if high_res is not None:
        feat_s1, feat_s0 = high_res
        n = feat_s1.shape[0]
        want = ((n, conv1.out_channels, 2 * h, 2 * w), (n, conv2.out_channels, 4 * h, 4 * w))
        if (tuple(feat_s1.shape), tuple(feat_s0.shape)) != want:
            raise ValueError(f"need high_res levels {want[0]} and {want[1]} for these tokens; "
                             f"got {tuple(feat_s1.shape)} and {tuple(feat_s0.shape)}")
        if image_index is None:
            image_index = torch.arange(p, device=src.device) if n > 1 else torch.zeros(p, dtype=torch.long, device=src.device)
    reason = _unsupported_reason(src, upscaling, hyper_in, high_res or ())
    if reason is not None:
        note_fallback("upscaled_masks", reason, "the GEMM reference path")
        if high_res is not None:  # each prompt's own image's levels, channels-last
            high_res = tuple(feat.index_select(0, image_index).permute(0, 2, 3, 1) for feat in high_res)
        return upscaled_masks_reference(src, upscaling, hyper_in, high_res)
    norm = upscaling[1]
    s1, s0 = (None, None) if high_res is None else (
        feat.permute(0, 2, 3, 1).contiguous() for feat in high_res)  # per image: small copies
    return _run_kernel(
        src, conv1.weight, conv1.bias, norm.weight, norm.bias, conv2.weight, conv2.bias, hyper_in, float(norm.eps),
        s1, s0, None if image_index is None else image_index.to(torch.int64).contiguous(),
    )
