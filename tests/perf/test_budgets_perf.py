"""Speed and memory budgets (parity/budgets.toml) on the GPU, measured with pytest-benchmark.

    python -m pytest tests/perf --benchmark-json=perf.json          # figures, with budgets in extra_info
    python -m pytest tests/perf --benchmark-autosave                 # keep this run ...
    python -m pytest tests/perf --benchmark-compare                  # ... and set a later one beside it
    python -m pytest tests/perf --budget-gpu H100                    # hold another GPU to H100 rows
    python -m pytest tests/perf --perf-matrix                        # every row, not only GATE_ROWS

One test per (model, stage, batch) row of any GPU in budgets.toml; by default only GATE_ROWS run
(the rows that gate PRs), the others skip unless --perf-matrix. A row takes its model from the
session's model cache, compiled in the row's `compile_mode` (max-autotune unless the row says otherwise), drops every other cached model (peak memory is the
row's own), warms up, times image encoder + prompt encoder + mask decoder + upscaling on
COCO-like prompts (bench.ladder's e2e, what the published img/s covers) and checks img/s and
peak GiB against the row of the GPU found (or --budget-gpu). A GPU without that row skips with
the row's name (a gating row fails instead under --require-gpu). Planted defects (a slowdown, an
oversized allocation) prove the check fails. With --perf-warm-up a row builds and compiles its model
and skips: the gate runs `-k test_stage_within_budget --perf-warm-up` beside its GPU layers, so that
perf's compiles, after them on two cores, are cache hits.
"""

from __future__ import annotations

import pytest
import torch

from bench.ladder import SamfastRunner, make_inputs
from parity.checks import budgets

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("perf")]  # rows and planted defects share builds

ROWS = sorted({key[1:] for key in budgets.load_budgets()})  # (model, stage, batch) over every GPU
# The rows a PR must not regress: the project's two headline configurations (README, ANCHORS.md).
GATE_ROWS = {("vit_b", "nt", 32), ("vit_h", "nt", 8)}
ROUNDS = 5


def budget_or_skip(gpu: str, model: str, stage: str, batch: int, require_gpu: bool) -> budgets.Budget:
    """The row's budget. Without one the test skips, naming the row to add; with --require-gpu a row
    that gates PRs fails instead: a gate on a GPU with no rows would otherwise pass having timed nothing."""
    try:
        return budgets.lookup(gpu, model, stage, batch)
    except budgets.MissingBudget as missing:
        if require_gpu and (model, stage, batch) in GATE_ROWS:
            pytest.fail(f"{missing} With --require-gpu a row that gates PRs must be timed, not skipped.", pytrace=False)
        pytest.skip(str(missing))


@pytest.fixture
def budget_for(request):
    def lookup(model: str, stage: str, batch: int) -> budgets.Budget:
        gpu = request.config.getoption("--budget-gpu") or torch.cuda.get_device_name()
        return budget_or_skip(gpu, model, stage, batch, request.config.getoption("--require-gpu"))

    return lookup


def measure(benchmark, call, batch: int) -> tuple[float, float]:
    """(img/s from the benchmark's median round, peak GiB over the timed rounds) of `call` on `batch` images.

    The one synchronize per round is the deliberate end of the timed region.
    """

    def round_():
        call()
        torch.cuda.synchronize()

    round_()  # first call: compiles, and sets up the decoder's NestedTensor path
    torch.cuda.reset_peak_memory_stats()
    benchmark.pedantic(round_, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    img_s = batch / benchmark.stats.stats.median
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    benchmark.extra_info.update(img_s=round(img_s, 2), peak_gib=round(peak_gib, 3), batch=batch)
    return img_s, peak_gib


def assert_within(budget: budgets.Budget, img_s: float, peak_gib: float, benchmark) -> None:
    benchmark.extra_info.update(budget_row=budget.row, min_img_s=budget.min_img_s, max_peak_gib=budget.max_peak_gib)
    failures = budgets.check(budget, img_s, peak_gib)
    assert not failures, "budget missed:\n  " + "\n  ".join(failures) + f"\n  row source: {budget.source}"


def e2e_call(model_cache, budget: budgets.Budget):
    """bench.ladder's e2e call (encoder + prompts + decoder + upscaling) on the cached build of the row's stage."""
    device = torch.device("cuda")
    entry = model_cache.entry(budget.model, budget.stage, batch=budget.batch, compile_mode=budget.compile_mode, device=device)
    model_cache.keep_only(entry)
    runner = SamfastRunner(budget.model, budget.stage, budget.batch, device, model=entry.model)
    images, prompts = make_inputs(budget.batch, runner.dtype, device)
    return lambda: runner.e2e(images, prompts)


@pytest.mark.parametrize(("model", "stage", "batch"), ROWS, ids=[f"{m}-{s}-{b}" for m, s, b in ROWS])
@torch.no_grad()
def test_stage_within_budget(model, stage, batch, benchmark, budget_for, model_cache, request):
    if (model, stage, batch) not in GATE_ROWS and not request.config.getoption("--perf-matrix"):
        pytest.skip("not a row that gates PRs (GATE_ROWS); run with --perf-matrix to time every row")
    budget = budget_for(model, stage, batch)
    call = e2e_call(model_cache, budget)
    if request.config.getoption("--perf-warm-up"):
        call()  # every shape the timed rounds run, compiled into the cache
        pytest.skip("--perf-warm-up: built and compiled, not timed")
    img_s, peak_gib = measure(benchmark, call, batch)
    assert_within(budget, img_s, peak_gib, benchmark)


# --- planted defects: the same measurement and check must fail ------------------------------------
# A gate row, so the planted defects time the model the row built (the defects wrap the call; the
# model itself is the real one).
PLANTED = ("vit_b", "nt", 32)
assert PLANTED in GATE_ROWS


@pytest.fixture
def planted_call(model_cache, budget_for):
    return e2e_call(model_cache, budget_for(*PLANTED))


@torch.no_grad()
def test_planted_slowdown_fails_the_budget(benchmark, budget_for, planted_call):
    budget = budget_for(*PLANTED)
    stall_cycles = int(1e9)  # ~0.5 s of GPU clock per round: a batch of 32 then runs under 64 img/s

    def slowed():
        torch.cuda._sleep(stall_cycles)
        planted_call()

    img_s, peak_gib = measure(benchmark, slowed, PLANTED[2])
    failures = budgets.check(budget, img_s, peak_gib)
    assert any("img/s" in f and "< floor" in f for f in failures), failures


@torch.no_grad()
def test_planted_oversized_allocation_fails_the_budget(benchmark, budget_for, planted_call):
    budget = budget_for(*PLANTED)
    extra_bytes = int((budget.max_peak_gib + 1) * 2**30)

    def bloated():
        ballast = torch.empty(extra_bytes, dtype=torch.uint8, device="cuda")  # the defect: held across the call
        planted_call()
        del ballast

    img_s, peak_gib = measure(benchmark, bloated, PLANTED[2])
    failures = budgets.check(budget, img_s, peak_gib)
    assert any("peak memory" in f and "> ceiling" in f for f in failures), failures
