"""sam2's MLP: SAM 1's (same `layers.{i}` keys) with a choice of activation.

The mask decoder's heads use ReLU, as SAM 1's do; Hiera's blocks use GELU (samfast.sam2.mlp.HieraMLP), and
the object-score head of sam2's decoder has three layers: one class covers them with the official key names.
"""

from __future__ import annotations

import torch
from torch import nn

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
