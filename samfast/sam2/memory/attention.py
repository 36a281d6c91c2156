"""SAM 2's memory attention: the current frame's features attend to themselves and to the memories.

Layers of pre-norm self-attention, cross-attention to the memory tokens (both with 2-D rotary
encodings; the object-pointer tokens at the end of the memory are not rotated) and a ReLU MLP,
then a final LayerNorm. Inputs are sequence-first (L, B, C), as sam2 passes them.

The rotations follow the feature map's size (16 x 16 at a 256 input, 64 x 64 at 1024): computed in
forward for a new size, outside the layers, so a compiled graph of the layers (compile_static) reads
them as an input and never sees a module attribute change. A memory padded to a fixed capacity
(samfast.sam2.tracker) comes with a key mask that takes the padding out of the cross-attention.

The cross-attention has one head of 256 channels over 4096 queries and a memory of up to 7 frames of
4096 tokens, then up to 64 object-pointer tokens; at the fixed capacity (samfast.sam2.tracker) its
padding is masked out. With `split_by_memory_frame` (the sdpa switch's, set by samfast.stages), on a
GPU (splits_by_memory_frame), the queries attend to each memory frame unmasked (a frame slot is all
memory or all padding; one object's frames in one batched kernel call, several objects' in a call per
frame slot) and to the pointer tokens in plain masked math; the
parts are merged by their log-sum-exp, a padded slot with no weight: the same softmax. The values stay
at the memory's channels, the value projection folded into the output projection (_folded_output).
The split pays twice: cuDNN's kernel runs longer with a mask than without, and one object's single
sequence leaves most of a GPU's SMs idle where its frames fill them
(docs/measurements/video/memory-attention-by-frame-h100-2026-11-26.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from samfast.kernels.rotated_keys import rotated_keys
from samfast.modeling.common import linear_relu
from samfast.modeling.rope import apply_rotary_enc, axial_rotations, rotate, rotated_keys_reference
from samfast.sam2.memory.static_graphs import compile_per_object_count
from samfast.modeling.position_encoding import made_for_inference_only

ROPE_THETA = 10000.0
ROPE_FEAT_SIZES = (64, 64)  # the feature map at sam2's 1024 input


def splits_by_memory_frame(device: torch.device) -> bool:
    """Where the sdpa switch's split runs: on a GPU. On a CPU one masked call costs about the same (its
    kernel walks every key anyway), and keeps fp32+sdpa bit-equal to sam2 (tests/unit/test_sam2_video.py,
    test_sam2_modules.py); the CPU tests that hold the split to the one call patch this."""
    return device.type == "cuda"


# the bias of a padded pointer key: exp of it underflows to exactly 0 beside any real key's score (fp32's
# exp is 0 below -104), and an object with no pointer yet gets a finite part of zero weight (-inf: a NaN part)
PADDED_KEY_BIAS = -1e4


def _attention_and_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention output and the log-sum-exp of each query's scores (B, H, Lq), in one kernel: the
    SDPA backends' own ops (F.scaled_dot_product_attention does not return the log-sum-exp); bias
    (B, H, Lq, Lk), added to the scores. cuDNN's measured fastest on an H100 (half precision only); in
    fp32 or below Hopper, the memory-efficient kernel."""
    if q.device.type != "cuda":
        # the CPU kernel takes values of the queries' width only: narrower ones padded with zero channels,
        # which weigh to zero and are cut off again
        width = v.shape[-1]
        padded = F.pad(v, (0, q.shape[-1] - width))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, padded, attn_mask=bias)[:2]
        return out[..., :width], lse
    if q.dtype in (torch.float16, torch.bfloat16) and torch.cuda.get_device_capability(q.device) >= (9, 0):
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)[:2]
    return out, lse[..., : q.shape[-2]]  # the efficient kernel pads the queries to a multiple of 32


def _pointer_bias(pointer_mask: torch.Tensor, heads: int, queries: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, heads, queries, P) bias of the pointer tokens: 0 for a real one, PADDED_KEY_BIAS for padding
    (pointer_mask (B, P) bool). Its rows lie 16 elements apart, filled in place, as the memory-efficient
    kernel reads them ("attn_bias is not correctly aligned (strideB)" for rows of 10 in fp32); one row per
    object, broadcast to every query."""
    b, p = pointer_mask.shape
    bias = torch.zeros(b, 1, 1, -(-p // 16) * 16, dtype=dtype, device=pointer_mask.device)[..., :p]
    bias.masked_fill_(~pointer_mask[:, None, None, :], PADDED_KEY_BIAS)
    return bias.expand(b, heads, queries, p)


def attention_by_memory_frame(q: torch.Tensor, k: torch.Tensor, pointer_keys: torch.Tensor, v: torch.Tensor,
                              key_mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q [k, pointer_keys]^T / sqrt(d)) v for (B, H, L, D) inputs whose keys k are memory frames of
    L tokens each (as many as the queries) and pointer_keys the pointer tokens', given apart (the rotated
    frames need no copy into one tensor with the pointers); v holds the values of both, frames first.
    Each frame is attended unmasked (for one object all frames in one call, for several a call per
    frame), the pointers in one call with their padding biased out (_pointer_bias), and each part's
    output is weighted by exp(its log-sum-exp - the total's). key_mask (B, keys) bool, False for a key
    that takes no part: a frame's tokens must all be in or all out (the tracker pads whole frames), only
    its first token is read. Every query must keep at least one key."""
    b, h, lq, d = q.shape
    merge = torch.promote_types(q.dtype, torch.float32)  # bf16 parts merged in fp32
    num_ptr_tokens, frame_keys = pointer_keys.shape[-2], k.shape[-2]
    if frame_keys % lq:
        raise ValueError(f"{frame_keys} memory frame tokens are not whole frames of the queries' {lq} tokens")
    frames = frame_keys // lq
    if key_mask is None:
        key_mask = torch.ones(b, frame_keys + num_ptr_tokens, dtype=torch.bool, device=k.device)

    if b == 1:
        # one object: its frames in one kernel call, a batch of `frames` sequences (one sequence alone
        # leaves most SMs idle). The queries are copied once per frame: contiguous, since
        # cuDNN lays its output out like the queries, and a view with frames 0 apart was refused ("stride
        # for the last dimension ... should be 1 for output O", H100, bf16)
        def per_frame(x: torch.Tensor) -> torch.Tensor:  # (1, H, frames * L, C) -> (frames, H, L, C)
            return x.reshape(h, frames, lq, x.shape[-1]).transpose(0, 1)

        queries = q.expand(frames, h, lq, d).contiguous()
        parts = [_attention_and_lse(queries, per_frame(k), per_frame(v[:, :, :frame_keys]))]
    else:
        # several objects fill the GPU: one call per frame slot over every object, reading the queries as
        # they are and each slot's keys and values in place (no copies: docs/history/sam2-video-speed.md, 666f9fa)
        parts = [_attention_and_lse(q, k[:, :, f * lq:(f + 1) * lq], v[:, :, f * lq:(f + 1) * lq]) for f in range(frames)]
    in_memory = key_mask[:, :frame_keys:lq].reshape(b, frames, 1, 1)
    lse = torch.cat([part_lse.reshape(b, -1, h, lq) for _, part_lse in parts], dim=1)
    lse = lse.to(merge).masked_fill(~in_memory, float("-inf"))
    outs = [out.reshape(b, -1, h, lq, v.shape[-1]) for out, _ in parts]
    if num_ptr_tokens:
        bias = _pointer_bias(key_mask[:, frame_keys:], h, lq, q.dtype)
        pointers_out, pointers_lse = _attention_and_lse(q, pointer_keys, v[:, :, frame_keys:], bias)
        lse = torch.cat([lse, pointers_lse.to(merge).reshape(b, 1, h, lq)], dim=1)
        outs.append(pointers_out.unsqueeze(1))
    weights = torch.softmax(lse, dim=1).unsqueeze(-1)  # (B, parts, H, L, 1)
    return (torch.cat(outs, dim=1).to(merge) * weights).sum(dim=1).to(q.dtype)


class RoPEAttention(nn.Module):
    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        dropout: float = 0.1,
        kv_in_dim: int | None = None,
        rope_k_repeat: bool = False,
    ) -> None:
        super().__init__()
        kv_in_dim = kv_in_dim or embedding_dim
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embedding_dim, embedding_dim)
        self.k_proj = nn.Linear(kv_in_dim, embedding_dim)
        self.v_proj = nn.Linear(kv_in_dim, embedding_dim)
        self.out_proj = nn.Linear(embedding_dim, embedding_dim)
        self.dropout_p = dropout
        self.rope_k_repeat = rope_k_repeat
        self.split_by_memory_frame = False  # the sdpa switch's (samfast.stages): attention_by_memory_frame
        # "module" (k_proj, then the rotation) or "triton" (the triton switch's, samfast.stages): the memory
        # frames' keys projected and rotated in one kernel, kernels.rotated_keys (one head only)
        self.key_impl = "module"

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rotations: torch.Tensor,
        num_k_exclude_rope: int = 0,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """rotations: those of the queries' map (MemoryAttention.rotations); key_mask (B, keys)
        bool, False for a key that must take no part (a padded memory slot), None: every key."""
        by_frame = (self.split_by_memory_frame and self.rope_k_repeat and not self.training
                    and splits_by_memory_frame(q.device))
        # one head split by frame: the value projection folded into the output projection (_folded_output),
        # so the attention weighs the memory's own kv_in_dim channels (64 for sam2's 256)
        folded = by_frame and self.num_heads == 1
        if q.shape[-2] != k.shape[-2] and not self.rope_k_repeat:
            raise ValueError("keys longer than the queries need rope_k_repeat (memory cross-attention)")
        num_k_rope = k.shape[-2] - num_k_exclude_rope
        v = v.unsqueeze(1) if folded else self._heads(self.v_proj(v))
        if self.key_impl == "triton" and self.rope_k_repeat and self.num_heads == 1:
            q = rotate(self._heads(self.q_proj(q)), rotations)
            k_rope = rotated_keys(k[:, :num_k_rope], self.k_proj.weight, self.k_proj.bias, rotations,
                                  reference=rotated_keys_reference).unsqueeze(1)
            pointer_keys = self._heads(self.k_proj(k[:, num_k_rope:]))
        else:
            q, k = self._heads(self.q_proj(q)), self._heads(self.k_proj(k))
            q, k_rope = apply_rotary_enc(q, k[:, :, :num_k_rope], rotations, repeat_freqs_k=self.rope_k_repeat)
            pointer_keys = k[:, :, num_k_rope:]
        if by_frame:
            # the rotated frames and the pointers stay apart: the kernel that rotates the keys writes the
            # frames alone (the kernel that rotated them into one tensor with the pointers:
            # docs/history/figures-from-docstrings.md)
            out = attention_by_memory_frame(q, k_rope, pointer_keys, v, key_mask)
        else:
            k = torch.cat([k_rope, pointer_keys], dim=2)
            attn_mask = None if key_mask is None else key_mask[:, None, None, :]
            dropout_p = self.dropout_p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        b, heads, n, c = out.shape
        out = out.transpose(1, 2).reshape(b, n, heads * c)
        return self._folded_output(out) if folded else self.out_proj(out)

    def _folded_output(self, attended_memory: torch.Tensor) -> torch.Tensor:
        """out_proj(v_proj(.)) of the attention-weighted memory, as one linear map: a query's weights sum
        to 1, so weighting the projected values (P (M Wv^T + bv)) equals projecting the weighted memory
        (P M) Wv^T + bv, the attention reading values of 64 channels instead of 256
        (docs/measurements/video/memory-attention-by-frame-h100-2026-11-26.md).
        The product of the two weights is formed in fp32, then rounded once to the layer's dtype."""
        w_o, w_v = self.out_proj.weight, self.v_proj.weight
        weight = (w_o.float() @ w_v.float()).to(w_o.dtype)
        bias = F.linear(self.v_proj.bias.float(), w_o.float(), self.out_proj.bias.float()).to(w_o.dtype)
        return F.linear(attended_memory, weight, bias)


class MemoryAttentionLayer(nn.Module):
    def __init__(self, d_model: int, dim_feedforward: int, mem_dim: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.self_attn = RoPEAttention(d_model, num_heads=1, dropout=dropout)
        self.cross_attn_image = RoPEAttention(d_model, num_heads=1, dropout=dropout, kv_in_dim=mem_dim, rope_k_repeat=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        # "module" (as sam2 runs it) or "epilogue": linear1 and its ReLU as one GEMM (linear_relu), set by
        # the compile switch's tracking half (samfast.sam2.video_predictor.compile_tracking)
        self.relu_impl = "module"

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        pos: torch.Tensor,
        rotations: torch.Tensor,
        num_k_exclude_rope: int = 0,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # every config: no positional encoding in self-attention nor on the cross-attention queries,
        # the memory's on its keys
        tgt2 = self.norm1(tgt)
        tgt = tgt + self.dropout1(self.self_attn(tgt2, tgt2, tgt2, rotations))
        tgt2 = self.norm2(tgt)
        tgt2 = self.cross_attn_image(tgt2, memory + pos, memory, rotations, num_k_exclude_rope, memory_mask)
        tgt = tgt + self.dropout2(tgt2)
        tgt2 = self.norm3(tgt)
        if self.relu_impl == "epilogue":
            hidden = linear_relu(tgt2, self.linear1.weight, self.linear1.bias)
        else:
            hidden = F.relu(self.linear1(tgt2))
        return tgt + self.dropout3(self.linear2(self.dropout(hidden)))


class MemoryAttention(nn.Module):
    def __init__(self, d_model: int, num_layers: int, mem_dim: int, dim_feedforward: int = 2048) -> None:
        super().__init__()
        self.d_model = d_model
        self.layers = nn.ModuleList(MemoryAttentionLayer(d_model, dim_feedforward, mem_dim) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        # one head in every layer's attentions: the rotations of a head of d_model channels, shared by all
        self.rotation_table = axial_rotations(d_model, *ROPE_FEAT_SIZES, theta=ROPE_THETA)
        self.compiled_attend = None  # set by compile_static (the compile switch)

    def compile_static(self, mode: str) -> None:
        """torch.compile the layers (fullgraph): the tracker pads the memory to a fixed capacity, so a
        video's steps share one shape; a static graph for one object, one for every larger batch (static_graphs)."""
        # curr, memory, curr_pos: (tokens, objects, channels); memory_mask (objects, tokens); memory_pos is
        # the objects' one encoding (tokens, 1, channels)
        self.compiled_attend = compile_per_object_count(self.attend, mode, {0: 1, 1: 1, 2: 1, 6: 0})

    def rotations(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        """The rotations of a square map of num_tokens tokens (kept for the next call of that size,
        made again where made_for_inference_only)."""
        if self.rotation_table.shape[1] != num_tokens or made_for_inference_only(self.rotation_table):
            side = math.sqrt(num_tokens)
            self.rotation_table = axial_rotations(self.d_model, side, side, theta=ROPE_THETA)
        if self.rotation_table.device != device:
            self.rotation_table = self.rotation_table.to(device)
        return self.rotation_table

    def forward(
        self,
        curr: torch.Tensor,
        memory: torch.Tensor,
        curr_pos: torch.Tensor,
        memory_pos: torch.Tensor,
        num_obj_ptr_tokens: int = 0,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """curr, curr_pos (L, B, C); memory (M, B, mem_dim), the last num_obj_ptr_tokens of them object
        pointers, and its encodings memory_pos (M, B or 1, mem_dim); memory_mask (B, M) bool, False for
        a padded memory token -> (L, B, C)."""
        if isinstance(curr, list):  # sam2 passes one-element lists
            (curr,), (curr_pos,) = curr, curr_pos
        attend = self.attend if self.compiled_attend is None else self.compiled_attend
        rotations = self.rotations(curr.shape[0], curr.device)
        return attend(curr, memory, curr_pos, memory_pos, rotations, num_obj_ptr_tokens, memory_mask)

    def attend(
        self,
        curr: torch.Tensor,
        memory: torch.Tensor,
        curr_pos: torch.Tensor,
        memory_pos: torch.Tensor,
        rotations: torch.Tensor,
        num_obj_ptr_tokens: int,
        memory_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        output = (curr + 0.1 * curr_pos).transpose(0, 1)  # pos_enc_at_input in every config
        memory, memory_pos = memory.transpose(0, 1), memory_pos.transpose(0, 1)
        for layer in self.layers:
            output = layer(output, memory, memory_pos, rotations, num_obj_ptr_tokens, memory_mask)
        return self.norm(output).transpose(0, 1)
