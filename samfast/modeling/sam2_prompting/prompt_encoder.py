"""SAM 2's prompt encoder: SAM 1's, plus box corners given as points (labels 2 and 3).

Same architecture and keys as SAM 1's; the one difference is that sam2's predictors pass a box as
its two corners inside the point prompts, labelled 2 (top left) and 3 (bottom right), and its
prompt encoder adds the corner embeddings to points with those labels.
"""

from __future__ import annotations

import torch

from samfast.modeling.prompt_encoder import PromptEncoder


class Sam2PromptEncoder(PromptEncoder):
    def _embed_points(self, points: torch.Tensor, labels: torch.Tensor, pad: bool) -> torch.Tensor:
        embedding = super()._embed_points(points, labels, pad)
        if pad:  # the padding point SAM 1's method appended has label -1
            labels = torch.cat([labels, labels.new_full((labels.shape[0], 1), -1)], dim=1)
        labels = labels[..., None]
        embedding = embedding + torch.where(labels == 2, self.point_embeddings[2].weight, 0.0)
        return embedding + torch.where(labels == 3, self.point_embeddings[3].weight, 0.0)
