"""Checks the parity gate runs: syncs (profiler traces), compile (graph breaks, recompiles), budgets, and
switch proof (exercised: did each switch of a stage run; switch_proofs: what each must leave behind).

Import the submodules directly (``from parity.checks.syncs import find_syncs``); nothing is imported
here, so ``import parity`` stays fast and does not pull in torch.
"""
