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
        # clone: compiled with CUDA graphs, the output buffers are reused by the next call
        chunks.append(tree_map(lambda t: t[:real].clone(), encoder(chunk)))
    return chunks[0] if len(chunks) == 1 else tree_map(lambda *parts: torch.cat(parts), *chunks)
