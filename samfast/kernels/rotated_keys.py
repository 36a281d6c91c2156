"""The memory cross-attention's keys: the key projection and the rotation in one Triton kernel.

SAM 2's memory attention projects every memory token (the memory plus its encodings, mem_dim = 64
channels) to its one head of 256 channels, then rotates each memory frame's tokens by the 2-D axial
rotations of the feature map (samfast.modeling.rope). Compiled, that was a GEMM writing the
(objects, frames x 4096, 256) keys and passes reading them back to rotate them
(docs/measurements/video/video-profile-h200-hiera_l-objects-2026-11-28-11e1536.md). Here a program takes
BLOCK_M token positions of one object in every memory frame: it loads the weights of each pair's first
and second channel and the positions' rotations once, then per frame multiplies the tokens by both
(K = 64: one tl.dot each), adds the biases, turns each pair and writes the keys once, interleaved as
the module path lays them out. Measured in the tracker: docs/history/sam2-video-speed.md (11e1536).

Arithmetic: fp32 accumulation, bias and rotation, one rounding to the input dtype at the end (the module
path rounds the projection to it before rotating).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from samfast.kernels.dispatch import TritonKernel, dot_precision, is_power_of_2, launcher, loop_bound, note_fallback, tl, triton, unsupported_reason

__all__ = ["rotated_keys"]

#: Token positions per program under the interpreter (no autotuning there). Tests may change it.
_INTERPRET_BLOCK_M = 32

#: The module path the kernel stands in for, with the kernel's arguments: (x, weight, bias, rotations) -> keys.
#: The caller passes its own (samfast.modeling.rope.rotated_keys_reference for SAM 2's memory attention),
#: so that kernels/ imports no model code.
KeysReference = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _rotated_keys_fwd(
    X, W, Bias, Rot, Out,
    stride_xb, stride_xm, stride_xk,
    stride_ob, stride_om,
    FRAMES,  # the frame loop's bound, launched through dispatch.loop_bound
    L,  # tokens of a frame, the rotations' rows
    K: tl.constexpr,  # input channels (mem_dim)
    HALF: tl.constexpr,  # output pairs: C / 2
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    # one program: BLOCK_M token positions of one batch row, in every memory frame; the weights and the
    # positions' rotations are loaded once and serve all the frames
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    position = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    in_frame = position < L
    offs_k = tl.arange(0, K)
    pairs = tl.arange(0, HALF)
    # weight (2 HALF, K), contiguous: the even rows make each pair's first channel, the odd its second
    w_first = tl.load(W + (2 * pairs)[None, :] * K + offs_k[:, None])
    w_second = tl.load(W + (2 * pairs + 1)[None, :] * K + offs_k[:, None])
    b_first = tl.load(Bias + 2 * pairs).to(tl.float32)[None, :]
    b_second = tl.load(Bias + 2 * pairs + 1).to(tl.float32)[None, :]
    # rotations (2, L, 2 HALF) fp32, contiguous: row 0 each pair's cosine twice, row 1 (-sine, sine)
    row = position[:, None].to(tl.int64) * (2 * HALF)
    cos = tl.load(Rot + row + (2 * pairs)[None, :], mask=in_frame[:, None], other=0.0)
    sin = tl.load(Rot + L * (2 * HALF) + row + (2 * pairs + 1)[None, :], mask=in_frame[:, None], other=0.0)
    for frame in range(0, FRAMES):
        token = (frame * L + position).to(tl.int64)
        x = tl.load(X + b * stride_xb + token[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=in_frame[:, None], other=0.0)
        first = tl.dot(x, w_first, input_precision=PRECISION) + b_first
        second = tl.dot(x, w_second, input_precision=PRECISION) + b_second
        keys = tl.join(first * cos - second * sin, first * sin + second * cos)  # (BLOCK_M, HALF, 2)
        keys = tl.reshape(keys, (BLOCK_M, 2 * HALF))  # each pair's two channels side by side
        tl.store(Out + b * stride_ob + token[:, None] * stride_om + tl.arange(0, 2 * HALF)[None, :],
                 keys.to(Out.dtype.element_ty), mask=in_frame[:, None])


_CONFIGS = (
    [triton.Config({"BLOCK_M": m}, num_warps=w, num_stages=2) for m, w in ((32, 4), (64, 4), (64, 8))]
    if triton is not None
    else []
)
_KERNEL = TritonKernel(_rotated_keys_fwd, _CONFIGS, key=["K", "HALF"])


def _new_output(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1], weight.shape[0])


def _rotated_keys_kernel(x, weight, bias, rotations) -> torch.Tensor:
    out = _new_output(x, weight)
    b, tokens, k = x.shape
    frame_tokens = rotations.shape[1]
    kernel, meta = _KERNEL.pick(BLOCK_M=_INTERPRET_BLOCK_M)

    def grid(meta_):
        return (triton.cdiv(frame_tokens, meta_["BLOCK_M"]), b)

    launcher()(kernel)[grid](
        x, weight, bias, rotations, out,
        *x.stride(), out.stride(0), out.stride(1),
        loop_bound(tokens // frame_tokens),
        frame_tokens,
        K=k,
        HALF=weight.shape[0] // 2,
        PRECISION=dot_precision(x.dtype),
        **meta,
    )
    return out


if triton is not None and hasattr(torch.library, "triton_op"):
    # A custom op, so torch.compile sees one node and no graph break (see relpos_attention.py).
    @torch.library.triton_op("samfast::rotated_keys", mutates_args=())
    def _rotated_keys_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
        return _rotated_keys_kernel(x, weight, bias, rotations)

    @_rotated_keys_op.register_fake
    def _(x, weight, bias, rotations):
        return _new_output(x, weight)

    def _run(x, weight, bias, rotations):
        return torch.ops.samfast.rotated_keys(x, weight, bias, rotations)

else:  # pragma: no cover - old torch: plain launch, still correct, not traceable
    _run = _rotated_keys_kernel


def rotated_keys(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, rotations: torch.Tensor, *,
                 reference: KeysReference) -> torch.Tensor:
    """The rotated keys (B, frames x L, C) of memory tokens x (B, frames x L, K) (the memory plus its
    encodings), any strides: linear(x, weight (C, K), bias (C,)), every frame of L tokens rotated by
    rotations (2, L, C) (rope.axial_rotations).

    Runs the kernel on CUDA (fp16, bf16, fp32) or under TRITON_INTERPRET=1 (fp16, fp32) for K and C / 2
    powers of 2 of at least 16; otherwise ``reference(x, weight, bias, rotations)``, the module path the
    caller computes the same keys with, the reason counted in samfast.kernels.dispatch.
    """
    channels = weight.shape[0]
    if x.dim() != 3 or weight.shape != (channels, x.shape[2]) or bias.shape != (channels,) or (
        rotations.shape[0] != 2 or rotations.shape[2] != channels or x.shape[1] % rotations.shape[1]
    ):
        raise ValueError(f"rotated_keys takes x (B, frames x L, K), weight (C, K), bias (C,) and rotations (2, L, C); "
                         f"got {tuple(x.shape)}, {tuple(weight.shape)}, {tuple(bias.shape)}, {tuple(rotations.shape)}")
    reason = unsupported_reason((x, weight, bias))
    if reason is None and (rotations.dtype != torch.float32 or rotations.device != x.device):
        reason = "rotations not float32 on the keys' device"
    if reason is None and not (is_power_of_2(x.shape[2], at_least=16) and is_power_of_2(channels // 2, at_least=16)):
        reason = "input channels or output pairs not powers of 2 >= 16"
    if reason is None and not (weight.is_contiguous() and rotations.is_contiguous()):
        reason = "a weight or rotations that are not contiguous"
    if reason is not None:
        note_fallback("rotated_keys", reason, "the linear and the rotation apart")
        return reference(x, weight, bias, rotations)
    return _run(x, weight, bias, rotations)
