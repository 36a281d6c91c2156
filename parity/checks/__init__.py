"""Checks the parity gate runs: syncs (profiler traces), compile (graph breaks, recompiles), budgets.

Import the submodules directly (``from parity.checks.syncs import find_syncs``); nothing is imported
here, so ``import parity`` stays fast and does not pull in torch.
"""
