"""Speed and memory budgets (parity/budgets.toml) on the GPU, measured with pytest-benchmark.

    python -m pytest tests/perf --benchmark-json=perf.json          # figures, with budgets in extra_info
    python -m pytest tests/perf --benchmark-autosave                 # keep this run ...
    python -m pytest tests/perf --benchmark-compare                  # ... and set a later one beside it
    python -m pytest tests/perf --budget-gpu H100                    # hold another GPU to H100 rows

One test per (model, stage, batch) row of any GPU in budgets.toml: it builds that stage, warms it
up (compiling there), times image encoder + prompt encoder + mask decoder + upscaling on
COCO-like prompts (bench.ladder's e2e, what the published img/s covers) and checks img/s and
peak GiB against the row of the GPU found (or --budget-gpu). A GPU without that row skips with
the row's name. Planted defects (a slowdown, an oversized allocation) prove the check fails.
"""

from __future__ import annotations

import pytest
import torch

from bench.ladder import SamfastRunner, make_inputs
from parity.checks import budgets

pytestmark = pytest.mark.gpu

ROWS = sorted({key[1:] for key in budgets.load_budgets()})  # (model, stage, batch) over every GPU
ROUNDS = 5


@pytest.fixture
def budget_for(request):
    def lookup(model: str, stage: str, batch: int) -> budgets.Budget:
        gpu = request.config.getoption("--budget-gpu") or torch.cuda.get_device_name()
        try:
            return budgets.lookup(gpu, model, stage, batch)
        except budgets.MissingBudget as missing:
            pytest.skip(str(missing))

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


def e2e_call(model: str, stage: str, batch: int):
    """bench.ladder's e2e call on a fresh build of the stage: encoder + prompts + decoder + upscaling."""
    device = torch.device("cuda")
    runner = SamfastRunner(model, stage, batch, device)
    images, prompts = make_inputs(batch, runner.dtype, device)
    return lambda: runner.e2e(images, prompts)


def _clean_slate() -> None:
    torch._dynamo.reset()  # each stage compiles from scratch, as in bench.ladder
    torch.cuda.empty_cache()


@pytest.fixture
def clean_slate():
    _clean_slate()
    yield
    _clean_slate()


@pytest.mark.parametrize(("model", "stage", "batch"), ROWS, ids=[f"{m}-{s}-{b}" for m, s, b in ROWS])
@torch.no_grad()
def test_stage_within_budget(model, stage, batch, benchmark, budget_for, clean_slate):
    budget = budget_for(model, stage, batch)
    img_s, peak_gib = measure(benchmark, e2e_call(model, stage, batch), batch)
    assert_within(budget, img_s, peak_gib, benchmark)


# --- planted defects: the same measurement and check must fail ------------------------------------
PLANTED = ("vit_b", "nt", 32)


@pytest.fixture(scope="module")
def planted_call():
    """The PLANTED stage, built and compiled once for both planted defects."""
    _clean_slate()
    yield e2e_call(*PLANTED)
    _clean_slate()


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
