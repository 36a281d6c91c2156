"""samfast.modeling.rope: the rotary encoding in real arithmetic equals sam2's complex one, bit for bit
on the CPU, and a compiled graph of it holds no complex tensor (inductor would run those eagerly)."""

from __future__ import annotations

import pytest
import torch

from samfast.modeling.rope import apply_rotary_enc, axial_rotations

sam2_encoding = pytest.importorskip("sam2.modeling.position_encoding", reason="needs the sam2 package (test extra)")


@pytest.mark.parametrize("keys_per_query", [1, 3, 0], ids=["self", "three-memory-frames", "no-keys"])
def test_equals_sam2s_complex_rotation(keys_per_query):
    torch.manual_seed(0)
    side, dim = 8, 64
    q = torch.randn(2, 1, side * side, dim)
    k = torch.randn(2, 1, keys_per_query * side * side, dim)
    cis = sam2_encoding.compute_axial_cis(dim, side, side)
    cos, sin = cis.real, cis.imag  # each pair's (c, c) and (-d, d)
    table = torch.stack([cos.repeat_interleave(2, -1), torch.stack([-sin, sin], -1).flatten(-2)])
    assert torch.equal(axial_rotations(dim, side, side), table)
    theirs = sam2_encoding.apply_rotary_enc(q, k, cis, repeat_freqs_k=keys_per_query > 1)
    ours = apply_rotary_enc(q, k, axial_rotations(dim, side, side), repeat_freqs_k=keys_per_query > 1)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def _traced_dtypes(fn, *args) -> list[torch.dtype]:
    """The dtypes of every tensor in the graph dynamo traces of fn(*args)."""
    seen = []

    def backend(graph, example_inputs):
        seen.extend(node.meta["example_value"].dtype for node in graph.graph.nodes
                    if isinstance(node.meta.get("example_value"), torch.Tensor))
        return graph.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    torch._dynamo.reset()
    return seen


def test_a_compiled_rotation_holds_no_complex_tensor():
    """The reason for the real form: every tensor of the traced graph is real; sam2's form (the
    control) traces complex ones."""
    q, k = torch.randn(1, 1, 16, 32), torch.randn(1, 1, 48, 32)
    ours = _traced_dtypes(apply_rotary_enc, q, k, axial_rotations(32, 4, 4), True)
    assert ours and not any(dtype.is_complex for dtype in ours), ours
    theirs = _traced_dtypes(sam2_encoding.apply_rotary_enc, q, k, sam2_encoding.compute_axial_cis(32, 4, 4), True)
    assert any(dtype.is_complex for dtype in theirs), theirs
