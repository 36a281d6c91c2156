"""Hiera's block MLP: sam2's MLP (samfast.modeling.sam2_prompting.mlp) with SAM 1's MLPBlock GELU paths."""

from __future__ import annotations

import torch
from torch import nn

from samfast.modeling.common import gelu_mlp, linear_accumulate, linear_gelu_tanh
from samfast.modeling.sam2_prompting.mlp import MLP


class HieraMLP(MLP):
    """Hiera's block MLP (two layers, GELU; sam2's `layers.{0,1}` keys) with SAM 1's MLPBlock GELU paths:
    `gelu_impl` "module" (as sam2 runs it) or "epilogue" (lin1 and its tanh GELU as one GEMM, set by the
    compile switch on a bf16 encoder) or "quantized_kernel" (the triton switch with int8 or fp8: GELU and
    lin2's activation quantization in one kernel) (samfast.modeling.common.gelu_mlp).

    On the "epilogue" path the block's residual joins lin2's GEMM too (`add_to`)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__(dim, hidden_dim, dim, num_layers=2, activation=nn.GELU)
        self.gelu_impl = "module"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin1, lin2 = self.layers
        return gelu_mlp(x, lin1, lin2, self.act, self.gelu_impl)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + self(x). On the "epilogue" path lin2's GEMM accumulates into residual + lin2's bias
        (linear_accumulate): the separate add read the residual and lin2's output and wrote the sum, a
        pass over three (tokens, dim) tensors per block (docs/history/sam2-encoder-speed.md); the bias joins
        the residual in the kernel that already writes it (the attention's residual add), and cuBLAS reads the
        sum in its epilogue."""
        if self.gelu_impl != "epilogue":
            return residual + self(x)
        # contiguous: the GEMM writes rows of out (the sum takes a permuted residual's strides in eager)
        out = (residual + self.layers[1].bias).contiguous()
        self.accumulate_unbiased(out, x)
        return out

    def accumulate_unbiased(self, out: torch.Tensor, x: torch.Tensor) -> None:
        """out += self(x) - lin2's bias, in place, on the "epilogue" path's two GEMMs (a caller that
        adds the bias itself, later: Hiera's residual stream in window order)."""
        lin1, lin2 = self.layers
        linear_accumulate(out, linear_gelu_tanh(x, lin1.weight, lin1.bias), lin2.weight)
