"""SAM 2's memory attention: the current frame's features attend to themselves and to the memories.

Layers of pre-norm self-attention, cross-attention to the memory tokens (both with 2-D rotary
encodings; the object-pointer tokens at the end of the memory are not rotated) and a ReLU MLP,
then a final LayerNorm. Inputs are sequence-first (L, B, C), as sam2 passes them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from samfast.sam2.memory.rope import apply_rotary_enc, compute_axial_cis


class RoPEAttention(nn.Module):
    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        dropout: float = 0.1,
        kv_in_dim: int | None = None,
        rope_theta: float = 10000.0,
        rope_k_repeat: bool = False,
        feat_sizes: tuple[int, int] = (64, 64),
    ) -> None:
        super().__init__()
        kv_in_dim = kv_in_dim or embedding_dim
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embedding_dim, embedding_dim)
        self.k_proj = nn.Linear(kv_in_dim, embedding_dim)
        self.v_proj = nn.Linear(kv_in_dim, embedding_dim)
        self.out_proj = nn.Linear(embedding_dim, embedding_dim)
        self.dropout_p = dropout
        self.rope_theta = rope_theta
        self.rope_k_repeat = rope_k_repeat
        self.freqs_cis = compute_axial_cis(embedding_dim // num_heads, *feat_sizes, theta=rope_theta)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_k_exclude_rope: int = 0) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(q)), self._heads(self.k_proj(k)), self._heads(self.v_proj(v))
        if self.freqs_cis.shape[0] != q.shape[-2]:  # a square map of another size
            side = math.sqrt(q.shape[-2])
            self.freqs_cis = compute_axial_cis(q.shape[-1], side, side, theta=self.rope_theta)
        self.freqs_cis = self.freqs_cis.to(q.device)
        if q.shape[-2] != k.shape[-2] and not self.rope_k_repeat:
            raise ValueError("keys longer than the queries need rope_k_repeat (memory cross-attention)")
        num_k_rope = k.shape[-2] - num_k_exclude_rope
        q, k_rope = apply_rotary_enc(q, k[:, :, :num_k_rope], self.freqs_cis, repeat_freqs_k=self.rope_k_repeat)
        k = torch.cat([k_rope, k[:, :, num_k_rope:]], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p if self.training else 0.0)
        b, heads, n, c = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, heads * c))


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

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, num_k_exclude_rope: int = 0) -> torch.Tensor:
        # every config: no positional encoding in self-attention nor on the cross-attention queries,
        # the memory's on its keys
        tgt2 = self.norm1(tgt)
        tgt = tgt + self.dropout1(self.self_attn(tgt2, tgt2, v=tgt2))
        tgt2 = self.norm2(tgt)
        tgt2 = self.cross_attn_image(q=tgt2, k=memory + pos, v=memory, num_k_exclude_rope=num_k_exclude_rope)
        tgt = tgt + self.dropout2(tgt2)
        tgt2 = self.linear2(self.dropout(F.relu(self.linear1(self.norm3(tgt)))))
        return tgt + self.dropout3(tgt2)


class MemoryAttention(nn.Module):
    def __init__(self, d_model: int, num_layers: int, mem_dim: int, dim_feedforward: int = 2048) -> None:
        super().__init__()
        self.d_model = d_model
        self.layers = nn.ModuleList(MemoryAttentionLayer(d_model, dim_feedforward, mem_dim) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(
        self,
        curr: torch.Tensor,
        memory: torch.Tensor,
        curr_pos: torch.Tensor,
        memory_pos: torch.Tensor,
        num_obj_ptr_tokens: int = 0,
    ) -> torch.Tensor:
        """curr, curr_pos (L, B, C); memory, memory_pos (M, B, mem_dim) -> (L, B, C)."""
        if isinstance(curr, list):  # sam2 passes one-element lists
            (curr,), (curr_pos,) = curr, curr_pos
        output = (curr + 0.1 * curr_pos).transpose(0, 1)  # pos_enc_at_input in every config
        memory, memory_pos = memory.transpose(0, 1), memory_pos.transpose(0, 1)
        for layer in self.layers:
            output = layer(output, memory, memory_pos, num_k_exclude_rope=num_obj_ptr_tokens)
        return self.norm(output).transpose(0, 1)
