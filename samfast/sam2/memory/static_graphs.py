"""torch.compile into one static graph per input shape, for the tracker's memory encoder and attention.

Their shapes follow the number of objects tracked together (and of conditioning frames), so a process that
tracks sessions of many object counts compiles a graph for each. Dynamo caps the graphs of one function at
torch._dynamo.config.recompile_limit (8 by default) and, with fullgraph, raises FailOnRecompileLimitHit past
it: a ninth object count crashed tracking (CPU, torch 2.14, session 27). Each call here lifts the cap to
GRAPHS_PER_FUNCTION for its own cache lookup (config.patch, scoped to the call: the process's setting stays
its own everywhere else). One graph for every object count (the dimension marked dynamic) would need no cap;
it changes the compiled tracker's kernels, so it waits for a GPU measurement.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

GRAPHS_PER_FUNCTION = 64  # object counts x conditioning-frame counts one process may track


def compile_per_shape(fn: Callable, mode: str) -> Callable:
    """fn compiled (fullgraph, static shapes, `mode`), callable with up to GRAPHS_PER_FUNCTION shapes."""
    compiled = torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)

    def call(*args, **kwargs):
        limit = max(torch._dynamo.config.recompile_limit, GRAPHS_PER_FUNCTION)
        with torch._dynamo.config.patch(recompile_limit=limit):
            return compiled(*args, **kwargs)

    return call
