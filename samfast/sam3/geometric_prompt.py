"""SAM 3's geometric prompt (sam3.model.geometry_encoders.Prompt): the boxes and points of a batch of prompts.

Sequence first, as sam3 holds them: box_embeddings (N_boxes, B, 4) normalized cx, cy, w, h; point_embeddings
(N_points, B, 2) normalized x, y; labels (N, B) with 1 positive and 0 negative (bool or long); masks (B, N)
True where an entry is padding. Every sequence is right-padded: each prompt's real entries come first.
A prompt with no boxes (or no points) holds a sequence of length 0, so a text-only prompt is
`Prompt(box_embeddings=torch.zeros(0, B, 4), box_mask=torch.zeros(B, 0, dtype=torch.bool))`, as sam3's
image model builds it. sam3's mask prompts are left out: the image model's geometry encoder has no mask
encoder and ignores them.
"""

from __future__ import annotations

import torch


def concat_padded_sequences(
    seq1: torch.Tensor, mask1: torch.Tensor, seq2: torch.Tensor, mask2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two right-padded sequences (L, B, C) with masks (B, L) as one right-padded sequence (L1 + L2, B, C):
    per prompt, seq1's real entries then seq2's, then padding. The shapes are static (L1 + L2 whatever the
    padding), each prompt's seq2 entries are scattered to just after its seq1 entries; no host sync.

    The padding slots hold what sam3's own concatenation leaves there (seq1's padding where seq2 did not
    land, zeros after), so even the padded outputs equal sam3's.
    """
    (len1, batch, width), len2 = seq1.shape, seq2.shape[0]
    real1, real2 = (~mask1).sum(dim=-1), (~mask2).sum(dim=-1)
    mask = torch.arange(len1 + len2, device=seq2.device)[None] >= (real1 + real2)[:, None]
    out = torch.cat([seq1.to(seq2.dtype), seq2.new_zeros(len2, batch, width)])
    index = torch.arange(len2, device=seq2.device)[:, None] + real1[None]
    return out.scatter(0, index[:, :, None].expand(-1, -1, width), seq2), mask


class Prompt:
    def __init__(
        self,
        box_embeddings: torch.Tensor | None = None,
        box_mask: torch.Tensor | None = None,
        point_embeddings: torch.Tensor | None = None,
        point_mask: torch.Tensor | None = None,
        box_labels: torch.Tensor | None = None,
        point_labels: torch.Tensor | None = None,
    ) -> None:
        given = box_embeddings if box_embeddings is not None else point_embeddings
        if given is None:
            raise ValueError(
                "Prompt needs box_embeddings (N, B, 4) or point_embeddings (N, B, 2) to know its batch size: "
                "for a prompt without boxes pass box_embeddings=torch.zeros(0, B, 4)"
            )
        batch, device = given.shape[1], given.device
        self.box_embeddings, self.box_labels, self.box_mask = _filled(box_embeddings, box_labels, box_mask, 4, batch, device)
        self.point_embeddings, self.point_labels, self.point_mask = _filled(
            point_embeddings, point_labels, point_mask, 2, batch, device
        )
        _check("box", self.box_embeddings, self.box_labels, self.box_mask, 4, batch)
        _check("point", self.point_embeddings, self.point_labels, self.point_mask, 2, batch)

    def append_boxes(self, boxes: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add boxes (N, B, 4) with labels (N, B) after each prompt's real boxes (sam3's Prompt.append_boxes)."""
        self.box_embeddings, self.box_labels, self.box_mask = _appended(
            "box", self.box_embeddings, self.box_labels, self.box_mask, boxes, labels, mask, 4
        )

    def append_points(self, points: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add points (N, B, 2) with labels (N, B) after each prompt's real points (sam3's Prompt.append_points)."""
        self.point_embeddings, self.point_labels, self.point_mask = _appended(
            "point", self.point_embeddings, self.point_labels, self.point_mask, points, labels, mask, 2
        )

    def clone(self) -> Prompt:
        return Prompt(
            box_embeddings=self.box_embeddings.clone(),
            box_mask=self.box_mask.clone(),
            point_embeddings=self.point_embeddings.clone(),
            point_mask=self.point_mask.clone(),
            box_labels=self.box_labels.clone(),
            point_labels=self.point_labels.clone(),
        )


def _filled(
    embeddings: torch.Tensor | None, labels: torch.Tensor | None, mask: torch.Tensor | None, width: int, batch: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sam3's defaults for what is not given: no entries, positive labels, nothing padded."""
    if embeddings is None:
        embeddings = torch.zeros(0, batch, width, device=device)
    length = embeddings.shape[0]
    if labels is None:
        labels = torch.ones(length, batch, dtype=torch.long, device=device)
    if mask is None:
        mask = torch.zeros(batch, length, dtype=torch.bool, device=device)
    return embeddings, labels, mask


def _check(kind: str, embeddings: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, width: int, batch: int) -> None:
    length = embeddings.shape[0]
    expected = {"embeddings": (length, batch, width), "labels": (length, batch), "mask": (batch, length)}
    for name, tensor in zip(expected, (embeddings, labels, mask)):
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(
                f"{kind} {name} of shape {tuple(tensor.shape)}, expected {expected[name]}: "
                f"{kind}s are sequence first (N, B, {width}), labels (N, B), masks batch first (B, N)"
            )
        if tensor.device != embeddings.device:
            raise ValueError(f"{kind} {name} on {tensor.device}, its embeddings on {embeddings.device}: move them to one device")


def _appended(
    kind: str, embeddings: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
    new: torch.Tensor, new_labels: torch.Tensor, new_mask: torch.Tensor | None, width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch = embeddings.shape[1]
    _, new_labels, new_mask = _filled(new, new_labels, new_mask, width, batch, new.device)
    _check(kind, new, new_labels, new_mask, width, batch)
    joined_labels, _ = concat_padded_sequences(labels[..., None], mask, new_labels[..., None], new_mask)
    joined, joined_mask = concat_padded_sequences(embeddings, mask, new, new_mask)
    return joined, joined_labels[..., 0], joined_mask
