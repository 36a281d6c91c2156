"""Suite-wide switches and the gate's plumbing.

* GPU layers skip without CUDA unless --require-gpu turns skips into failures; CPU tests marked gpu_runner
  skip unless either is present: parity.gate.gpu_runner.
* xdist workers each take one GPU (CUDA_VISIBLE_DEVICES, set before CUDA initialises): parity.gate.devices.
* the persistent compile cache is validated and switched on unless a parent process (parity.gate) did:
  parity.gate.compile_cache; sealed at the end of a run that finished.
* `model_cache`: one build per (model, stage, batch, compile mode, device) for the whole session:
  parity.gate.models.
* --gate-time PATH: per-test seconds and compile seconds (from xdist workers in their reports), written as
  each test ends: parity.gate.timing.
* under the gate (SAMFAST_TEST_TIMES), the slowest tests of its previous run start first: parity.gate.run_order,
  and xdist hands the groups out in that order without hoarding: parity.gate.scheduler.
* each xdist worker takes its share of the cores as OpenMP threads, unless OMP_NUM_THREADS is set:
  parity.gate.threads.
* under xdist, tests that share a module-scoped fixture run on one worker: parity.gate.worker_groups.
* after each test the CUDA memory it freed goes back to the driver (the gate's GPU processes share one GPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from parity.gate import compile_cache, gpu_runner, run_order, threads, vec_isa, worker_groups
from parity.gate import timing as gate_time
from parity.gate.devices import WORKERS_PER_GPU_ENV, gpu_for_worker, visible_gpus
from parity.tasks.source import release_gpu_cache


def pytest_addoption(parser):
    parser.addoption(
        "--require-gpu",
        action="store_true",
        help="fail (instead of skip) tests marked gpu when no CUDA device is present",
    )
    parser.addoption(
        "--budget-gpu",
        metavar="NAME",
        help="hold the perf layer to this GPU's rows of parity/budgets.toml (A100, H100, H200) "
        "instead of the rows of the GPU found",
    )
    parser.addoption(
        "--perf-matrix",
        action="store_true",
        help="time every (model, stage, batch) row of parity/budgets.toml, not only the rows that gate PRs",
    )
    parser.addoption(
        "--perf-warm-up",
        action="store_true",
        help="perf rows build and compile their models and time nothing (the gate runs this beside the GPU "
        "layers, so that perf's own compiles are cache hits)",
    )
    parser.addoption("--gate-time", metavar="PATH", type=Path, help="write per-test timings (JSON) for the gate's table")


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    config.pluginmanager.register(worker_groups.ModuleFixtureGroups(), "module-fixture-groups")
    if _is_worker(config):
        # xdist starts its workers with torch's thread per core each: more threads than cores, which spin
        threads.share_cores(config.workerinput["workercount"], torch.set_num_threads)
        per_gpu = int(os.environ.get(WORKERS_PER_GPU_ENV, "1"))
        device = gpu_for_worker(config.workerinput["workerid"], visible_gpus(), per_gpu)
        if device is not None:
            if torch.cuda.is_initialized():
                raise pytest.UsageError("CUDA was initialised before the xdist worker could choose its GPU")
            os.environ["CUDA_VISIBLE_DEVICES"] = device
        return
    if compile_cache.ENV_ACTIVE not in os.environ:
        config._samfast_cache = compile_cache.activate()
        vec_isa.settle(config._samfast_cache.path, may_write=config._samfast_cache.owned)
    config.pluginmanager.register(GateTimes(config.getoption("--gate-time")), "gate-times")


_COMPILED_BEFORE = pytest.StashKey[float]()
_CPU_BEFORE = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_COMPILED_BEFORE] = gate_time.compile_seconds_so_far()  # before any fixture compiles
    item.stash[_CPU_BEFORE] = gate_time.cpu_seconds_so_far()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The test's compile and CPU seconds (setup to teardown) and its slow marker's reason travel in its
    teardown report (user_properties), from an xdist worker too."""
    if call.when == "teardown":
        compiled = gate_time.compile_seconds_so_far() - item.stash.get(_COMPILED_BEFORE, 0.0)
        cpu = gate_time.cpu_seconds_so_far() - item.stash.get(_CPU_BEFORE, 0.0)
        slow = item.get_closest_marker("slow")
        item.user_properties += [("compile_seconds", round(compiled, 3)), ("cpu_seconds", round(cpu, 3)),
                                 ("slow_reason", slow.kwargs.get("reason", "") if slow else "")]
    return (yield)


class GateTimes:
    """Where reports arrive (the xdist controller, or the only process): one row per finished test,
    written out at once (--gate-time), so a run killed half way still leaves the times of what it finished."""

    def __init__(self, path: Path | None):
        self.path, self.rows, self._open = path, [], {}  # _open: nodeid -> (seconds so far, failed, started)

    def pytest_runtest_logreport(self, report):
        seconds, failed, started = self._open.get(report.nodeid, (0.0, False, report.start))
        self._open[report.nodeid] = (seconds + report.duration, failed or report.failed, started)
        if report.when != "teardown":
            return
        seconds, failed, started = self._open.pop(report.nodeid)
        node = getattr(report, "node", None)  # the xdist worker it came from (the controller sets it)
        self.rows.append(gate_time.TestTime(
            nodeid=report.nodeid,
            layer=gate_time.layer_of(report.nodeid),
            seconds=round(seconds, 3),
            compile_seconds=dict(report.user_properties).get("compile_seconds", 0.0),
            cpu_seconds=dict(report.user_properties).get("cpu_seconds", 0.0),
            slow_reason=dict(report.user_properties).get("slow_reason", ""),
            outcome="failed" if failed else "passed",
            started=round(started, 3),
            ended=round(report.stop, 3),
            worker=node.gateway.id if node is not None else "",
        ))
        if self.path:
            gate_time.write_tests(self.path, self.rows)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if _is_worker(config):
        return
    cache = getattr(config, "_samfast_cache", None)
    if cache is not None and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        compile_cache.seal(cache)


def pytest_collection_modifyitems(config, items):
    times = os.environ.get(run_order.TIMES_ENV)
    if times:  # the gate's runs: the slowest tests of its previous run first
        seconds, untimed = run_order.read_order(Path(times))
        items[:] = run_order.longest_first(items, seconds, nodeid=lambda item: item.nodeid,
                                           group_of=run_order.xdist_group, untimed=untimed)
    require = config.getoption("--require-gpu")
    on_gpu_runner = require or torch.cuda.is_available()
    for item in items:
        reason = gpu_runner.skip_reason(item.get_closest_marker(gpu_runner.MARKER), on_gpu_runner=on_gpu_runner)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    if torch.cuda.is_available():
        return
    for item in items:
        if "gpu" not in item.keywords:
            continue
        if require:
            item.add_marker(pytest.mark.usefixtures("_fail_without_gpu"))
        else:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none found); run on a GPU runner or with --require-gpu to fail instead"))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which may not be installed
def pytest_xdist_make_scheduler(config, log):
    """Under the gate, loadgroup keeps run_order's longest-first order (parity.gate.scheduler); else xdist's own."""
    if config.getvalue("dist") == "loadgroup" and os.environ.get(run_order.TIMES_ENV):
        from parity.gate.scheduler import LongestFirstScheduling

        return LongestFirstScheduling(config, log)
    return None


@pytest.fixture(autouse=True)
def _hand_back_cached_gpu_memory():
    """After each test, the CUDA memory it freed goes back to the driver (parity.tasks.source.release_gpu_cache):
    the gate's GPU workers and checks share one GPU, and one worker's cache was another's out-of-memory."""
    yield
    release_gpu_cache()


@pytest.fixture
def _fail_without_gpu():
    pytest.fail("--require-gpu was given but torch.cuda.is_available() is False")


@pytest.fixture
def triton_interpreted(monkeypatch):
    """Triton kernels run under the interpreter (TRITON_INTERPRET=1, on the CPU), fallback counts from zero."""
    yield from _kernels_with(monkeypatch, interpret=True)


@pytest.fixture
def triton_compiled(monkeypatch):
    """Triton kernels compiled for the GPU (no TRITON_INTERPRET), fallback counts from zero."""
    yield from _kernels_with(monkeypatch, interpret=False)


def _kernels_with(monkeypatch, interpret: bool):
    # samfast.kernels picks interpreted or compiled kernels per call, so the variable set here is enough
    from samfast.kernels import reset_fallback_counts

    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reset_fallback_counts()
    yield
    reset_fallback_counts()


@pytest.fixture
def aot_eager_compile(monkeypatch):
    """torch.compile traced by dynamo and AOTAutograd, then run as traced (backend aot_eager), dynamo reset around
    the test. For checks of what the front end decides (graphs, graph breaks, guards, recompiles, dynamo's cache),
    where inductor's C++ code generation would add minutes on a 2-core CPU and, on static shapes, no guard.
    Build the model inside the test: the compile switch calls torch.compile when the model is built."""
    yield from _compile_with(monkeypatch, "aot_eager")


@pytest.fixture
def dynamo_compile(monkeypatch):
    """torch.compile traced by dynamo alone, each graph run as dynamo captured it (backend eager), dynamo reset
    around the test. For checks of dynamo's own decisions on static shapes (guards on sizes and strides,
    recompiles, its recompile limit, its cache of code objects), where AOTAutograd adds no guard and took
    half the trace time (the nano tracker's five graphs: 34 s under aot_eager, 17 s under eager, 2 cores).
    Shapes marked dynamic keep aot_eager_compile: AOTAutograd's decompositions may specialise a size."""
    yield from _compile_with(monkeypatch, "eager")


def _compile_with(monkeypatch, backend: str):
    import functools

    import torch._dynamo

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def compile_backend(request):
    """The backend of the test's torch.compile, its indirect parameter (tests/compile_backends.py): for
    "aot_eager" the aot_eager_compile fixture is set up, "inductor" leaves torch.compile as it is."""
    if request.param == "aot_eager":
        request.getfixturevalue("aot_eager_compile")
    return request.param


@pytest.fixture(scope="session")
def model_cache():
    """Shared built models (eval + no_grad use only; see parity.gate.models). Fails at the end if one was changed."""
    from parity.gate.models import ModelCache

    cache = ModelCache()
    yield cache
    cache.check_untouched()


@pytest.fixture(scope="session")
def data_root():
    from parity.golden.settings import DataNotFoundError, data_root

    try:
        return data_root()
    except DataNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture
def tf32_checked_off(monkeypatch):
    """TF32 on, as PyTorch leaves cuDNN's convolutions by default; after the test, a check must have
    turned it off (parity.golden.manifest.no_tf32): its fp32 stages run as the golden ran."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    yield
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32, \
        "the check left TF32 on: its fp32 stages would not run as the golden ran"
