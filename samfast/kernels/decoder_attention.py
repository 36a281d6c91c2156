"""The mask decoder's cross attentions with the projections folded into per-prompt matrices.

SAM's two-way transformer lets each prompt's handful of tokens (5 output tokens and the prompt's
points, T ~ 7) attend to its 64 x 64 image tokens and back. In segment-everything mode there are
~1024 prompts, and after the first layer every prompt has its own image tokens: each (P, 4096, 256)
bf16 tensor is 2 GiB, and the module path writes and reads many of them (the per-prompt key, value
and query projections, attention outputs, out_proj, residual, layer norm). With T tokens on one side
the projections fold into small per-prompt matrices, so one pass over the image tokens does it all:

* token -> image (:func:`token_to_image_attention`): with q_h the tokens' queries of head h, the
  logits are ``(keys + pe) @ Wk_h^T q_h / sqrt(d)`` (k_proj's bias adds a constant per query and
  cancels in the softmax), one (C, H * T) matrix per prompt; the kernel runs an online softmax
  over the image tokens and pools the keys themselves, ``softmax^T @ keys`` (H * T, C); v_proj and
  out_proj then act on that small result (the softmax weights sum to 1, so v_proj's bias passes).
* image -> token with out_proj, the residual and the layer norm (:func:`image_to_token_attention`):
  ``norm(keys + softmax_per_head((keys + pe) @ A + a) @ B + out_bias)`` with ``A = Wq_h^T k_h /
  sqrt(d)`` (C, H * T), ``a = bq_h . k_h / sqrt(d)`` and ``B = v_h Wo_h^T`` (H * T, C) per prompt;
  each row of image tokens is read once and its normalised update written once.

Per-image keys (the first layer, before the image side becomes per prompt) are read through
image_index, so nothing per prompt is gathered first. T is padded to a power of 2 per head (zero
columns pool nothing that is kept; padded tokens get a -inf logit), or with `widest` to the most
they take, :func:`max_fused_tokens`: a graph compiled for any number of tokens (SAM 2's decoder)
needs its kernels' widths constant at trace time (a width that followed its symbolic count crashed
inductor on the H200 after 45 s of tracing).

Arithmetic: fp32 accumulation, softmax and layer norm; keys + pe and the softmax weights are
rounded to the input dtype before their tensor-core products, as flash attention rounds them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

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
    "image_to_token_attention",
    "image_to_token_attention_reference",
    "max_fused_tokens",
    "token_to_image_attention",
    "token_to_image_attention_reference",
]

MAX_COLUMNS = 128  # heads x padded tokens: the kernels keep a (columns, C) fp32 tile in registers
TOO_MANY_TOKENS = f"heads x padded tokens above {MAX_COLUMNS} (or heads not a power of 2)"  # a fallback reason
LOG2E = 1.4426950408889634

#: Image-token rows per step under the interpreter (no autotuning there). Tests may change it.
_INTERPRET_BLOCK_L = 32


# --------------------------------------------------------------------------- reference paths


def _per_prompt(keys: torch.Tensor, image_index: torch.Tensor | None) -> torch.Tensor:
    return keys if image_index is None else keys.index_select(0, image_index)


def token_to_image_attention_reference(attn: nn.Module, queries_in, keys, pe, image_index=None) -> torch.Tensor:
    """SAM's token -> image attention, ``attn(q=queries_in, k=keys + pe, v=keys)``, per prompt."""
    keys = _per_prompt(keys, image_index)
    return attn(q=queries_in, k=keys + pe, v=keys)


def image_to_token_attention_reference(
    attn: nn.Module, norm: nn.LayerNorm, keys, pe, tokens_k, tokens_v, image_index=None
) -> torch.Tensor:
    """SAM's image -> token attention with its residual and layer norm, per prompt."""
    keys = _per_prompt(keys, image_index)
    return norm(keys + attn(q=keys + pe, k=tokens_k, v=tokens_v))


# --------------------------------------------------------------------------- the kernels


def _token_to_image_fwd(
    X, PE, M, INDEX, Out,
    stride_xb, stride_xl,
    stride_pl,
    stride_mp, stride_mc,
    stride_op, stride_oq,
    L: tl.constexpr,  # image tokens (4096 for every SAM): a loop bound, so a constant (see the loop)
    C: tl.constexpr,
    NQ: tl.constexpr,  # heads x padded tokens
    PRECISION: tl.constexpr,  # tl.dot's input_precision (dispatch.dot_precision)
    BLOCK_L: tl.constexpr,
):
    # Builtins only (tl.reduce with the standard combine, tl.full), as in relpos_attention.py:
    # library helpers are bound to the TRITON_INTERPRET of import time.
    p = tl.program_id(0).to(tl.int64)
    image = tl.load(INDEX + p).to(tl.int64)
    offs_c = tl.arange(0, C)
    offs_q = tl.arange(0, NQ)
    m = tl.load(M + p * stride_mp + offs_c[:, None] * stride_mc + offs_q[None, :])  # (C, NQ), log2 units
    m_i = tl.full([NQ], float("-inf"), dtype=tl.float32)
    l_i = tl.full([NQ], 0.0, dtype=tl.float32)
    acc = tl.full([NQ, C], 0.0, dtype=tl.float32)
    x_base = X + image * stride_xb
    # A runtime bound here fails in Triton 3.6's interpreter under numpy >= 2.4 (range() takes the
    # argument's one-element array as an index): the H100 runner's Triton.
    for start in range(0, L, BLOCK_L):
        offs_l = start + tl.arange(0, BLOCK_L)
        l_mask = offs_l < L
        x = tl.load(x_base + offs_l[:, None] * stride_xl + offs_c[None, :], mask=l_mask[:, None], other=0.0)
        pe = tl.load(PE + offs_l[:, None] * stride_pl + offs_c[None, :], mask=l_mask[:, None], other=0.0)
        k = (x.to(tl.float32) + pe.to(tl.float32)).to(x.dtype)
        s = tl.dot(k, m, input_precision=PRECISION)
        s = tl.where(l_mask[:, None], s, float("-inf"))  # (BLOCK_L, NQ)
        m_new = tl.maximum(m_i, tl.reduce(s, 0, tl.standard._elementwise_max))
        w = tl.math.exp2(s - m_new[None, :])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.reduce(w, 0, tl.standard._sum_combine)
        acc = acc * alpha[:, None]
        acc = tl.dot(tl.trans(w.to(x.dtype)), x, acc, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(Out + p * stride_op + offs_q[:, None] * stride_oq + offs_c[None, :], acc.to(Out.dtype.element_ty))


def _image_to_token_fwd(
    X, PE, A, ABIAS, BV, OBIAS, G, BETA, INDEX, Out,
    stride_xb, stride_xl,
    stride_pl,
    stride_ap, stride_ac,
    stride_abp,
    stride_bp, stride_bq,
    stride_op, stride_ol,
    L,
    EPS: tl.constexpr,  # a constexpr: inductor hands float arguments of a triton_op kernel over as fp64
    C: tl.constexpr,
    NQ: tl.constexpr,  # heads x padded tokens
    T_PAD: tl.constexpr,  # padded tokens per head: the softmax runs over groups of T_PAD columns
    PRECISION: tl.constexpr,  # tl.dot's input_precision (dispatch.dot_precision)
    BLOCK_L: tl.constexpr,
):
    pid_l = tl.program_id(0)
    p = tl.program_id(1).to(tl.int64)
    image = tl.load(INDEX + p).to(tl.int64)
    offs_l = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    l_mask = offs_l < L
    offs_c = tl.arange(0, C)
    offs_q = tl.arange(0, NQ)

    x = tl.load(X + image * stride_xb + offs_l[:, None] * stride_xl + offs_c[None, :], mask=l_mask[:, None], other=0.0)
    pe = tl.load(PE + offs_l[:, None] * stride_pl + offs_c[None, :], mask=l_mask[:, None], other=0.0)
    k = (x.to(tl.float32) + pe.to(tl.float32)).to(x.dtype)
    a = tl.load(A + p * stride_ap + offs_c[:, None] * stride_ac + offs_q[None, :])  # (C, NQ), log2 units
    s = tl.dot(k, a, input_precision=PRECISION)
    s = s + tl.load(ABIAS + p * stride_abp + offs_q)[None, :]  # -inf on padded tokens

    # softmax over each head's tokens: columns (head, token)
    s3 = tl.reshape(s, [BLOCK_L, NQ // T_PAD, T_PAD])
    s3 = tl.math.exp2(s3 - tl.reduce(s3, 2, tl.standard._elementwise_max)[:, :, None])
    s3 = s3 / tl.reduce(s3, 2, tl.standard._sum_combine)[:, :, None]
    w = tl.reshape(s3, [BLOCK_L, NQ]).to(x.dtype)

    bv = tl.load(BV + p * stride_bp + offs_q[:, None] * stride_bq + offs_c[None, :])  # (NQ, C)
    y = tl.dot(w, bv, input_precision=PRECISION)
    y = y + x.to(tl.float32) + tl.load(OBIAS + offs_c).to(tl.float32)[None, :]
    mean = tl.reduce(y, 1, tl.standard._sum_combine) / C
    centred = y - mean[:, None]
    var = tl.reduce(centred * centred, 1, tl.standard._sum_combine) / C
    gamma = tl.load(G + offs_c).to(tl.float32)
    beta = tl.load(BETA + offs_c).to(tl.float32)
    y = centred * tl.math.rsqrt(var + EPS)[:, None] * gamma[None, :] + beta[None, :]
    tl.store(
        Out + p * stride_op + offs_l[:, None] * stride_ol + offs_c[None, :],
        y.to(Out.dtype.element_ty),
        mask=l_mask[:, None],
    )


_TOKEN_TO_IMAGE_CONFIGS = (
    [
        triton.Config({"BLOCK_L": b}, num_warps=w, num_stages=s)
        for b, w, s in ((64, 4, 2), (64, 8, 3), (128, 8, 2), (32, 4, 3))
    ]
    if triton is not None
    else []
)
_IMAGE_TO_TOKEN_CONFIGS = (
    [triton.Config({"BLOCK_L": b}, num_warps=w, num_stages=2) for b, w in ((32, 4), (64, 4), (64, 8), (128, 8))]
    if triton is not None
    else []
)

_TOKEN_TO_IMAGE = TritonKernel(_token_to_image_fwd, _TOKEN_TO_IMAGE_CONFIGS, key=["L", "C", "NQ"])
_IMAGE_TO_TOKEN = TritonKernel(_image_to_token_fwd, _IMAGE_TO_TOKEN_CONFIGS, key=["C", "NQ", "T_PAD"])


def _launch_token_to_image(keys, pe, m, index, out) -> None:
    kernel, meta = _TOKEN_TO_IMAGE.pick(BLOCK_L=_INTERPRET_BLOCK_L)
    launcher()(kernel)[(m.shape[0],)](
        keys, pe, m, index, out,
        keys.stride(0), keys.stride(1),
        pe.stride(0),
        m.stride(0), m.stride(1),
        out.stride(0), out.stride(1),
        L=keys.shape[1],
        C=keys.shape[2],
        NQ=m.shape[2],
        PRECISION=dot_precision(keys.dtype),
        **meta,
    )


def _launch_image_to_token(keys, pe, a, a_bias, b, out_bias, gamma, beta, index, out, t_pad: int, eps: float) -> None:
    kernel, meta = _IMAGE_TO_TOKEN.pick(BLOCK_L=_INTERPRET_BLOCK_L)
    length = keys.shape[1]

    def grid(meta_):
        return (triton.cdiv(length, meta_["BLOCK_L"]), a.shape[0])

    launcher()(kernel)[grid](
        keys, pe, a, a_bias, b, out_bias, gamma, beta, index, out,
        keys.stride(0), keys.stride(1),
        pe.stride(0),
        a.stride(0), a.stride(1),
        a_bias.stride(0),
        b.stride(0), b.stride(1),
        out.stride(0), out.stride(1),
        length,
        EPS=eps,
        C=keys.shape[2],
        NQ=a.shape[2],
        T_PAD=t_pad,
        PRECISION=dot_precision(keys.dtype),
        **meta,
    )


def _token_to_image_kernel(keys, pe, m, index):
    out = keys.new_empty(m.shape[0], m.shape[2], keys.shape[2])
    _launch_token_to_image(keys, pe, m, index, out)
    return out


def _image_to_token_kernel(keys, pe, a, a_bias, b, out_bias, gamma, beta, index, t_pad, eps):
    out = keys.new_empty(a.shape[0], keys.shape[1], keys.shape[2])
    _launch_image_to_token(keys, pe, a, a_bias, b, out_bias, gamma, beta, index, out, t_pad, eps)
    return out


if triton is not None and hasattr(torch.library, "triton_op"):
    # Custom ops, so torch.compile sees one node each and no graph break (see relpos_attention.py).
    @torch.library.triton_op("samfast::token_to_image_pool", mutates_args=())
    def _token_to_image_op(keys: torch.Tensor, pe: torch.Tensor, m: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return _token_to_image_kernel(keys, pe, m, index)

    @_token_to_image_op.register_fake
    def _(keys, pe, m, index):
        return keys.new_empty(m.shape[0], m.shape[2], keys.shape[2])

    @torch.library.triton_op("samfast::image_to_token_update", mutates_args=())
    def _image_to_token_op(
        keys: torch.Tensor,
        pe: torch.Tensor,
        a: torch.Tensor,
        a_bias: torch.Tensor,
        b: torch.Tensor,
        out_bias: torch.Tensor,
        gamma: torch.Tensor,
        beta: torch.Tensor,
        index: torch.Tensor,
        t_pad: int,
        eps: float,
    ) -> torch.Tensor:
        return _image_to_token_kernel(keys, pe, a, a_bias, b, out_bias, gamma, beta, index, t_pad, eps)

    @_image_to_token_op.register_fake
    def _(keys, pe, a, a_bias, b, out_bias, gamma, beta, index, t_pad, eps):
        return keys.new_empty(a.shape[0], keys.shape[1], keys.shape[2])

    def _run_token_to_image(*args):
        return torch.ops.samfast.token_to_image_pool(*args)

    def _run_image_to_token(*args):
        return torch.ops.samfast.image_to_token_update(*args)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable
    _run_token_to_image, _run_image_to_token = _token_to_image_kernel, _image_to_token_kernel


# --------------------------------------------------------------------------- dispatch and folding


def max_fused_tokens(heads: int) -> int:
    """The most tokens per prompt the kernels take with this many heads (heads x padded tokens <= MAX_COLUMNS)."""
    return MAX_COLUMNS // heads


def _padded_tokens(tokens: int, heads: int, widest: bool = False) -> int:
    """Tokens per head padded to a power of 2 with heads x tokens >= 16 (tl.dot's smallest width), or
    with `widest` to max_fused_tokens whatever the count."""
    if widest:
        return max_fused_tokens(heads)
    return max(triton.next_power_of_2(tokens), triton.cdiv(16, heads))


def _unsupported_reason(attn, keys, pe, tokens, extra=()) -> str | None:
    params = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.out_proj.weight)
    reason = unsupported_reason((keys, pe, tokens, *params, *extra))
    if reason is not None:
        return reason
    if keys.dtype == torch.float32 and not interpreting():
        # fp32 products without tensor cores: Triton 3.6 did not finish compiling the token-to-image
        # kernel within 60 s on an H100 (commit 3fc16ae, which added the folded attention); the module path is exact there, and the
        # kernels pay off in 16 bits
        return "float32 on the GPU (the kernels are built for 16-bit tensor-core products)"
    c = keys.shape[-1]
    if c < 16 or c & (c - 1):
        return "an image-token width that is not a power of 2 >= 16"
    heads = attn.num_heads
    # in a graph compiled for any token count the comparison is a guard, which its caller's routing
    # keeps true (Sam2MaskDecoder)
    if heads & (heads - 1) or tokens.shape[1] > max_fused_tokens(heads):
        return TOO_MANY_TOKENS
    return None


def _check_shapes(keys, pe, tokens, image_index) -> None:
    if keys.dim() != 3 or pe.shape[-2:] != keys.shape[-2:] or tokens.dim() != 3 or tokens.shape[-1] != keys.shape[-1]:
        raise ValueError(
            "need keys (B, L, C), pe (1, L, C) or (L, C) and tokens (P, T, C); got "
            f"{tuple(keys.shape)}, {tuple(pe.shape)} and {tuple(tokens.shape)}"
        )
    expected_prompts = keys.shape[0] if image_index is None else image_index.shape[0]
    if tokens.shape[0] != expected_prompts:
        raise ValueError(
            f"{tokens.shape[0]} prompts of tokens but {expected_prompts} of keys "
            "(one image-token set per prompt, or image_index with one entry per prompt)"
        )


def _kernel_inputs(keys, pe, image_index):
    """Row-major keys and pe (the kernels read channels contiguously) and an index for every prompt."""
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    pe = pe.reshape(pe.shape[-2:]).contiguous()
    if image_index is None:
        image_index = torch.arange(keys.shape[0], device=keys.device)
    return keys, pe, image_index


def _heads(x: torch.Tensor, heads: int, t_pad: int) -> torch.Tensor:
    """(P, T, H * d) -> (P, T_pad, H, d), zero tokens appended."""
    p, t, hd = x.shape
    return F.pad(x.view(p, t, heads, hd // heads), (0, 0, 0, 0, 0, t_pad - t))


def token_to_image_attention(attn: nn.Module, queries_in, keys, pe, image_index=None, *, widest=False) -> torch.Tensor:
    """``attn(q=queries_in, k=keys + pe, v=keys)`` (P, T, C) for each prompt, in one pass over its image tokens.

    attn is the decoder's Attention; queries_in (P, T, C) the tokens with their positional
    encoding; keys (P, L, C) per prompt, or (B, L, C) per image with image_index (P,); pe (1, L, C).
    widest: the tokens padded to max_fused_tokens, not to their count's power of 2 (the same numbers).
    Runs the kernel on CUDA (fp16, bf16) or under TRITON_INTERPRET=1 (fp16, fp32); otherwise
    :func:`token_to_image_attention_reference`, the reason counted in samfast.kernels.dispatch.
    """
    _check_shapes(keys, pe, queries_in, image_index)
    reason = _unsupported_reason(attn, keys, pe, queries_in)
    if reason is not None:
        note_fallback("token_to_image_attention", reason, "the module path")
        return token_to_image_attention_reference(attn, queries_in, keys, pe, image_index)
    keys, pe, image_index = _kernel_inputs(keys, pe, image_index)
    heads, (p, t, c) = attn.num_heads, queries_in.shape
    t_pad = _padded_tokens(t, heads, widest)
    q = _heads(attn.q_proj(queries_in), heads, t_pad)  # (P, T_pad, H, d)
    d = q.shape[-1]
    w_k = attn.k_proj.weight.view(heads, d, c)
    m = torch.einsum("pthd,hdc->pcht", q, w_k * (LOG2E / math.sqrt(d))).reshape(p, c, heads * t_pad)
    pooled = _run_token_to_image(keys, pe, m, image_index).view(p, heads, t_pad, c)[:, :, :t]
    values = torch.einsum("phtc,hdc->pthd", pooled, attn.v_proj.weight.view(heads, d, c))
    return attn.out_proj((values + attn.v_proj.bias.view(heads, d)).reshape(p, t, heads * d))


def image_to_token_attention(
    attn: nn.Module, norm: nn.LayerNorm, keys, pe, tokens_k, tokens_v, image_index=None, *, widest=False
) -> torch.Tensor:
    """``norm(keys + attn(q=keys + pe, k=tokens_k, v=tokens_v))`` (P, L, C), each image token read once.

    Shapes and widest as :func:`token_to_image_attention`; tokens_k, tokens_v (P, T, C). The kernel or
    :func:`image_to_token_attention_reference`, as there.
    """
    _check_shapes(keys, pe, tokens_k, image_index)
    if not isinstance(norm, nn.LayerNorm) or norm.weight is None or norm.bias is None:
        reason = "a norm other than an affine nn.LayerNorm"
    else:
        reason = _unsupported_reason(attn, keys, pe, tokens_k, (tokens_v, norm.weight, norm.bias))
    if reason is not None:
        note_fallback("image_to_token_attention", reason, "the module path")
        return image_to_token_attention_reference(attn, norm, keys, pe, tokens_k, tokens_v, image_index)
    keys, pe, image_index = _kernel_inputs(keys, pe, image_index)
    heads, (p, t, c) = attn.num_heads, tokens_k.shape
    t_pad = _padded_tokens(t, heads, widest)
    k = _heads(attn.k_proj(tokens_k), heads, t_pad)  # (P, T_pad, H, d)
    v = _heads(attn.v_proj(tokens_v), heads, t_pad)
    d = k.shape[-1]
    scale = LOG2E / math.sqrt(d)
    w_q = attn.q_proj.weight.view(heads, d, c)
    a = torch.einsum("pthd,hdc->pcht", k, w_q * scale).reshape(p, c, heads * t_pad)
    a_bias = torch.einsum("pthd,hd->pht", k.float(), attn.q_proj.bias.view(heads, d).float() * scale)
    padded = torch.arange(t_pad, device=keys.device) >= t
    a_bias = a_bias.masked_fill(padded, float("-inf")).reshape(p, heads * t_pad)
    b = torch.einsum("pthd,chd->phtc", v, attn.out_proj.weight.view(c, heads, d)).reshape(p, heads * t_pad, c)
    return _run_image_to_token(
        keys, pe, a, a_bias, b, attn.out_proj.bias, norm.weight, norm.bias, image_index, t_pad, float(norm.eps)
    )
