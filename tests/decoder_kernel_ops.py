"""samfast's triton_ops of the decoder attention kernels written as torch ops (their math, per prompt), for
tests where the kernels' arithmetic is not what is under test: a compiled graph that calls them traced on
the CPU (where the kernels cannot run inside torch.compile), or the routing between the decoder's graphs
(where the interpreted kernels take minutes over many prompts). The kernels' logits are in log2 units.
The kernels themselves are tested against fp64 math in tests/unit/test_decoder_attention_kernel.py."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def token_to_image_as_torch_ops(keys, pe, m, index):
    x = keys.index_select(0, index)
    weights = torch.softmax((x + pe) @ m * math.log(2), dim=1)  # over the image tokens
    return weights.transpose(1, 2) @ x


def image_to_token_as_torch_ops(keys, pe, a, a_bias, b, out_bias, gamma, beta, index, t_pad, eps):
    x = keys.index_select(0, index)
    p, length, columns = x.shape[0], x.shape[1], a.shape[2]
    logits = ((x + pe) @ a + a_bias[:, None, :]) * math.log(2)
    weights = torch.softmax(logits.view(p, length, columns // t_pad, t_pad), dim=-1).view(p, length, columns)
    return F.layer_norm(weights @ b + x + out_bias, (x.shape[-1],), gamma, beta, eps)


def kernels_as_torch_ops(monkeypatch) -> None:
    """The decoder attention kernels' launches replaced by their math in torch ops, as if on a GPU."""
    from samfast.kernels import decoder_attention as da

    monkeypatch.setattr(da, "unsupported_reason", lambda tensors: None)
    monkeypatch.setattr(da, "_run_token_to_image", token_to_image_as_torch_ops)
    monkeypatch.setattr(da, "_run_image_to_token", image_to_token_as_torch_ops)
