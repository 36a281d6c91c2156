"""Building blocks shared by the encoder and the decoder (names and parameters as in segment_anything)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast import kernels
from samfast.quantize import ACTIVATION_AMAX_FLOOR


@torch.library.custom_op("samfast::linear_gelu_tanh", mutates_args=())
def linear_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x @ weight.T + bias, approximate="tanh"); on CUDA one GEMM with the GELU in its epilogue.

    A custom op so that inductor keeps it whole: it would decompose aten._addmm_activation back
    into a GEMM and a separate GELU pass over the (tokens, 4 * dim) activation, the pass this avoids.
    """
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def _epilogue_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, use_gelu: bool) -> torch.Tensor:
    """act(x @ weight.T + bias) as one cuBLASLt GEMM, the activation (GELU or ReLU) in its epilogue."""
    out = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=use_gelu)
    return out.view(*x.shape[:-1], weight.shape[0])


def _linear_output(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The fake kernel of a linear op: an empty tensor of its output's shape."""
    return x.new_empty(*x.shape[:-1], weight.shape[0])


@linear_gelu_tanh.register_kernel("cuda")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    # cuBLASLt's GELU epilogue is the tanh form (on the CPU, _addmm_activation is the exact GELU,
    # hence the formula above there: the op means the same on every device).
    return _epilogue_gemm(x, weight, bias, use_gelu=True)


linear_gelu_tanh.register_fake(_linear_output)


@torch.library.custom_op("samfast::linear_relu", mutates_args=())
def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """relu(x @ weight.T + bias); on CUDA one GEMM with the ReLU in its epilogue (exact: no approximation).

    A custom op for the reason linear_gelu_tanh is one. SAM 2's memory attention MLP (4 layers of
    (objects x 4096, 256) -> 2048): in the compiled tracker at 8 objects inductor ran the ReLU as a pass of
    its own over the 2048-wide activation (docs/history/sam2-video-speed.md, 3e91064).
    """
    return F.relu(F.linear(x, weight, bias))


@linear_relu.register_kernel("cuda")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _epilogue_gemm(x, weight, bias, use_gelu=False)


linear_relu.register_fake(_linear_output)


@torch.library.custom_op("samfast::linear_accumulate", mutates_args=("out",))
def linear_accumulate(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """out += x @ weight.T, in place: one GEMM that reads out in its epilogue (cuBLAS's beta = 1);
    out contiguous, its rows in x's row order.

    A custom op that mutates out, so that inductor runs it on out's own buffer: written as
    torch.addmm(out, ...), the graph's functional addmm first copies its input into a new buffer
    (a device-to-device copy of the whole (tokens, dim) tensor per call: docs/history/sam2-encoder-speed.md).
    """
    out.view(-1, out.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), weight.t())


def linear_with_bias_channel(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """linear(x) for x with the channel of ones after the linear's inputs (kernels.norm_with_bias_channel),
    as one plain GEMM: the weight gains the bias as that channel's column, and zeros for the rest."""
    extra = x.shape[-1] - linear.in_features
    weight = torch.cat([linear.weight, linear.bias[:, None], linear.weight.new_zeros(linear.out_features, extra - 1)], dim=1)
    return x @ weight.t()


def bias_as_channel_pays(linear: nn.Linear) -> bool:
    """Where linear_with_bias_channel beat cuBLASLt's bias epilogue in bf16 at Hiera-L's batch-8
    shapes: inputs of at most 288 channels into outputs of at most 864 (its first two stages); from 576
    input channels, or into 1728 outputs, the epilogue was as fast or faster
    (docs/measurements/sam2-encoder/bias-epilogue-h200-2026-11-29.md)."""
    return linear.in_features <= 288 and linear.out_features <= 864


class MLPBlock(nn.Module):
    """lin2(act(lin1(x))), in one of three ways (`gelu_impl`, set by the stage switches):

    * "module": as written, what the reference runs.
    * "epilogue" (the compile switch on a bf16 encoder): lin1 and its GELU as one GEMM
      (`linear_gelu_tanh`): no separate GELU pass over the 4x-wide activation (docs/ladder.md). cuBLASLt's
      GELU is the tanh form, at most 4.7e-4 from the exact one
      (at x = 2.7, where a bf16 ulp of the output is 0.0156): below bf16's own rounding.
    * "quantized_kernel" (fp8 or int8 with the triton switch; lin1 and lin2 hold torchao's
      quantized weights): the GELU and lin2's per-token quantization in one pass
      (`kernels.gelu_quantize`), whose output goes straight into lin2's GEMM
      (`kernels.quantized_linear`).
    """

    def __init__(self, embedding_dim: int, mlp_dim: int, act: type[nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.lin1 = nn.Linear(embedding_dim, mlp_dim)
        self.lin2 = nn.Linear(mlp_dim, embedding_dim)
        self.act = act()
        self.gelu_impl = "module"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_mlp(x, self.lin1, self.lin2, self.act, self.gelu_impl)


def gelu_mlp(x: torch.Tensor, lin1: nn.Linear, lin2: nn.Linear, act: nn.Module, gelu_impl: str) -> torch.Tensor:
    """lin2(act(lin1(x))) by the path `gelu_impl` names (MLPBlock's docstring); SAM 2's Hiera MLP
    (samfast.sam2.mlp.HieraMLP) takes the same paths."""
    if gelu_impl == "epilogue":
        return lin2(linear_gelu_tanh(x, lin1.weight, lin1.bias))
    if gelu_impl == "quantized_kernel":
        q, scale = kernels.gelu_quantize(lin1(x), lin2.weight.qdata.dtype, ACTIVATION_AMAX_FLOOR)
        return kernels.quantized_linear(q, scale, lin2.weight, lin2.bias)
    return lin2(act(lin1(x)))


class LayerNorm2d(nn.Module):
    """LayerNorm over the channel dimension of an NCHW tensor."""

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.eps = eps

    def forward(self, x: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
        """x is NCHW, or (..., C) with channels_last (the decoder's upscaling as GEMMs); the same arithmetic."""
        dim, shape = (-1, (-1,)) if channels_last else (1, (-1, 1, 1))
        u = x.mean(dim, keepdim=True)
        s = (x - u).pow(2).mean(dim, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight.view(shape) * x + self.bias.view(shape)
