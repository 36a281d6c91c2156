"""SAM 2's two-way transformer: SAM 1's, with sam2's MLP keys and attention through SDPA.

The architecture is SAM 1's; two things differ. sam2 names each block's MLP `mlp.layers.{0,1}`
(SAM 1: `mlp.lin1`, `mlp.lin2`), so the blocks get sam2's MLP (the same ReLU MLP). And sam2's
Attention calls F.scaled_dot_product_attention where segment_anything writes the softmax out:
SAM 1's Attention has both, and "sdpa" is the one that equals sam2 to the last bit (the built model's
attention path is the stages' choice: samfast.stages.apply_stages).
"""

from __future__ import annotations

from samfast.modeling.transformer import Attention, TwoWayTransformer
from samfast.modeling.sam2_prompting.mlp import MLP


class Sam2TwoWayTransformer(TwoWayTransformer):
    def __init__(self, depth: int, embedding_dim: int, num_heads: int, mlp_dim: int, sam1_mlp_keys: bool = False) -> None:
        """sam1_mlp_keys: keep SAM 1's MLP (`mlp.lin1`, `mlp.lin2`), as SAM 3's tracker names it."""
        super().__init__(depth=depth, embedding_dim=embedding_dim, num_heads=num_heads, mlp_dim=mlp_dim)
        if not sam1_mlp_keys:
            for layer in self.layers:
                layer.mlp = MLP(embedding_dim, mlp_dim, embedding_dim, num_layers=2)
        for module in self.modules():
            if isinstance(module, Attention):
                module.attn_impl = "sdpa"
