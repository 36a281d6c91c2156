"""A compiled encoder that always sees one batch size: the batch zero-padded or split to it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map


def in_static_batches(encoder: Callable, images: torch.Tensor, size: int | None):
    """encoder(images) computed in calls of exactly `size` images (the last one zero-padded), so a
    compiled encoder sees one shape and never recompiles; None: one call as they come. The output
    may be a tensor or lists/dicts of them (SAM 2's feature pyramid), each with the batch first."""
    if size is None:
        return encoder(images)
    chunks = []
    for start in range(0, images.shape[0], size):
        chunk = images[start : start + size]
        real = chunk.shape[0]
        if real < size:
            chunk = torch.cat([chunk, chunk.new_zeros(size - real, *chunk.shape[1:])])
        chunks.append(own_copies(encoder(chunk), real))
    return chunks[0] if len(chunks) == 1 else tree_map(joined, *chunks)


def joined(*parts):
    """One output's chunks as one batch; anything else (SAM 3's absent tracker levels, None) as it is."""
    return torch.cat(parts) if isinstance(parts[0], torch.Tensor) else parts[0]


def own_copies(outputs, real: int):
    """Each output's first `real` entries, copied out of the encoder's buffers: compiled with CUDA graphs,
    those are reused by the next call. Two kinds are not copied. A view expanded over the batch (stride 0:
    SAM 2's positional encodings, one image's cached constant) is no such buffer, and copied it was made
    dense (352 MB a call at batch 8 for hiera_l: docs/history/sam2-encoder-speed.md, 5d2f225). A
    tensor returned twice (SAM 2's vision_features is backbone_fpn[-1]) is copied once and stays one tensor."""
    copies: dict[int, torch.Tensor] = {}

    def own(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:  # SAM 3's neck without its tracker branch
            return None
        if t.stride(0) == 0:
            return t[:real]
        if id(t) not in copies:
            copies[id(t)] = t[:real].clone()
        return copies[id(t)]

    return tree_map(own, outputs)
