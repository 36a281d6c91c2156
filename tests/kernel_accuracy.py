"""What the kernel tests share: a seed per test and the error they hold a kernel to."""

from __future__ import annotations

import zlib

import torch


def node_seed(request) -> int:
    """A seed of the test's own (its node id's CRC): its inputs stay the same from run to run and differ
    from every other test's."""
    return zlib.crc32(request.node.nodeid.encode())


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| relative to max |want|, in float64 (want is a float64 reference, or a path's output)."""
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max()).item()
