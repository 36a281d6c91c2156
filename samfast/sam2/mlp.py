"""sam2's MLP: SAM 1's (same `layers.{i}` keys) with a choice of activation.

The mask decoder's heads use ReLU, as SAM 1's do; Hiera's blocks use GELU, and the object-score
head of sam2's decoder has three layers: one class covers them with the official key names.
"""

from __future__ import annotations

import torch
from torch import nn

from samfast.modeling.common import gelu_mlp
from samfast.modeling.mask_decoder import MLP as SamMLP


class MLP(SamMLP):
    def __init__(
        self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int, activation: type[nn.Module] = nn.ReLU
    ) -> None:
        super().__init__(input_dim, hidden_dim, output_dim, num_layers)
        self.act = activation()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = self.act(layer(x))
        return self.layers[-1](x)


class HieraMLP(MLP):
    """Hiera's block MLP (two layers, GELU; sam2's `layers.{0,1}` keys) with SAM 1's MLPBlock GELU paths:
    `gelu_impl` "module" (as sam2 runs it) or "epilogue" (lin1 and its tanh GELU as one GEMM, set by the
    compile switch on a bf16 encoder) or "quantized_kernel" (the triton switch with int8 or fp8: GELU and
    lin2's activation quantization in one kernel) (samfast.modeling.common.gelu_mlp)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__(dim, hidden_dim, dim, num_layers=2, activation=nn.GELU)
        self.gelu_impl = "module"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin1, lin2 = self.layers
        return gelu_mlp(x, lin1, lin2, self.act, self.gelu_impl)
