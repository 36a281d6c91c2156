"""torch.compile for the tracker's memory encoder and attention and a propagated frame's heads: a static
graph for one object, one graph for every larger number of objects.

Each takes the objects tracked together as its batch. Compiled with static shapes only, every object
count was a graph of its own: a new count meant a new compile (minutes in max-autotune, the GPU default),
and past dynamo's recompile_limit (8) a fullgraph function raises FailOnRecompileLimitHit: a ninth count
crashed tracking (found after 7b3747a's runs: docs/history/sam2-video-speed.md). Now, from
DYNAMIC_FROM_OBJECTS on, the object dimension of each input is
marked dynamic, so those counts share a graph; one object, the common case and the headline, keeps a
static graph and its own kernels (split memory keys among them: samfast.sam2.memory.attention). The mark
is maybe_mark_dynamic, which lets a backend cut the range where its kernels differ (a CPU's convolutions
do at 16 images: there counts 2..15 share one graph and 16.. another) rather than fail the compile.

Other shapes still make graphs of their own (the attention's number of conditioning frames, the memory's
capacity): each call lifts dynamo's cap to GRAPHS_PER_FUNCTION for its own cache lookup (config.patch,
scoped to the call: the process's setting stays its own everywhere else).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map_only

GRAPHS_PER_FUNCTION = 64  # graphs of one function: conditioning-frame counts x capacities x object ranges
DYNAMIC_FROM_OBJECTS = 2  # from this many objects on, the object dimension is dynamic


def compile_per_object_count(fn: Callable, mode: str, object_dims: dict[int, int]) -> Callable:
    """fn compiled (fullgraph, `mode`): static for one object, dynamic in the objects from DYNAMIC_FROM_OBJECTS on.
    object_dims: {position of a tensor argument: its object dimension}; a None argument is skipped,
    the first one listed gives the count. The outputs are copies: with CUDA graphs (max-autotune,
    reduce-overhead) they live in the graphs' shared pool, which the next replay of any of these graphs
    may reuse ("accessing tensor output of CUDAGraphs that has been overwritten": the memory attention's
    output feeding the propagation heads), and the memory bank keeps every frame's memories, masks and
    pointers (sam2's vos_optimized clones them too)."""
    compiled = torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)
    (count_position, count_dim), *_ = object_dims.items()

    def call(*args):
        if args[count_position].shape[count_dim] >= DYNAMIC_FROM_OBJECTS:
            args = list(args)
            for position, dim in object_dims.items():
                if args[position] is not None:
                    # the mark stays on the tensor it is put on: on an alias, so that the caller's tensor
                    # enters other compiled graphs unmarked
                    args[position] = args[position].view(args[position].shape)
                    torch._dynamo.maybe_mark_dynamic(args[position], dim)
        limit = max(torch._dynamo.config.recompile_limit, GRAPHS_PER_FUNCTION)
        with torch._dynamo.config.patch(recompile_limit=limit):
            return tree_map_only(torch.Tensor, torch.clone, compiled(*args))

    return call
