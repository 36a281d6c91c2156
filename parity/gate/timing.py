"""Time to verdict: per-test timings of the gate's layers, merged across xdist workers, as a table.

Each pytest run records one row per test (layer, seconds of setup + call + teardown, seconds
dynamo/inductor spent compiling inside it, CPU seconds its process and the children it waited for used,
and the reason a slow test gives; an xdist worker sends the last three in the test's report)
and rewrites its JSON file as each test ends, so a killed run leaves the rows it finished. The gate driver (parity.gate) adds its own steps (the
`python -m parity check` process) and writes reports/gate-time.md and .json:

| layer | tests | seconds | compile seconds |

"seconds" add up the tests' own times: with N workers a layer's seconds can exceed the wall time,
which the table gives separately.
"""

from __future__ import annotations

import json
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

LAYERS = ("unit", "parity", "system", "gpu", "perf")


@dataclass
class TestTime:
    nodeid: str
    layer: str
    seconds: float
    compile_seconds: float
    outcome: str
    # when it ran (Unix time, setup's start to teardown's end) and on which xdist worker: the gate's
    # timeline (which worker idled, what ran last); 0 and "" in files written before they were kept
    started: float = 0.0
    ended: float = 0.0
    worker: str = ""
    # CPU seconds of the test's process plus the children it reaped (setup to teardown): on a machine of
    # few cores, what a test costs the others; 0 in files written before they were kept
    cpu_seconds: float = 0.0
    # why it is slow, from @pytest.mark.slow(reason="..."): a test over SLOW_TEST_SECONDS must say
    slow_reason: str = ""


def layer_of(nodeid: str) -> str:
    """tests/<layer>/... -> <layer>; anything else is 'other'."""
    parts = nodeid.split("::")[0].replace("\\", "/").split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in LAYERS else "other"


_seen = {"before_resets": 0.0, "last": 0.0}


def compile_seconds_so_far() -> float:
    """Seconds dynamo has spent compiling in this process (0 before torch._dynamo is imported).

    torch._dynamo.reset() clears dynamo's own tally, so a drop since the last look adds the last
    value seen to what came before; code that resets dynamo calls this just before (the model
    cache does), so no compile time is lost to a reset.
    """
    if "torch._dynamo.utils" not in sys.modules:
        return 0.0
    metrics = sys.modules["torch._dynamo.utils"].compilation_time_metrics
    current = float(sum(metrics.get("_compile.compile_inner", ())))
    if current < _seen["last"]:
        _seen["before_resets"] += _seen["last"]
    _seen["last"] = current
    return _seen["before_resets"] + current


def cpu_seconds_so_far() -> float:
    """CPU seconds (user + system) this process and its reaped children have used."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def summarize(tests: list[TestTime], steps: list[dict] = ()) -> list[dict]:
    """One row per layer in LAYERS order (layers without tests left out), then one per extra step."""
    rows = []
    for layer in (*LAYERS, "other"):
        mine = [t for t in tests if t.layer == layer]
        if mine:
            rows.append({
                "layer": layer,
                "tests": len(mine),
                "failed": sum(t.outcome == "failed" for t in mine),
                "seconds": round(sum(t.seconds for t in mine), 1),
                "compile_seconds": round(sum(t.compile_seconds for t in mine), 1),
                "cpu_seconds": round(sum(t.cpu_seconds for t in mine), 1),
            })
    return rows + [dict(step) for step in steps]


SLOWEST = 12  # the tests a time table lists by name: where a layer's wall time goes


def slowest(tests: list[TestTime], n: int = SLOWEST) -> list[dict]:
    """The n slowest tests, slowest first: one long test (or xdist group) can set a layer's wall time."""
    ranked = sorted(tests, key=lambda t: t.seconds, reverse=True)[:n]
    return [{"test": t.nodeid, "layer": t.layer, "seconds": round(t.seconds, 1),
             "compile_seconds": round(t.compile_seconds, 1), "cpu_seconds": round(t.cpu_seconds, 1),
             "slow_reason": t.slow_reason} for t in ranked]


# A test slower than this (setup to teardown, on the 2-core machine the gate's CPU budget is set for)
# must say why in its @pytest.mark.slow(reason=...): the suite's time is a budget, and an unexplained
# minute is the first place to look. The time table lists each one that gives no reason as a finding.
SLOW_TEST_SECONDS = 60.0


def unexplained_slow(tests: list[TestTime], limit: float = SLOW_TEST_SECONDS) -> list[str]:
    """One finding per test over `limit` seconds whose slow marker gives no reason, slowest first."""
    slow = sorted((t for t in tests if t.seconds > limit and not t.slow_reason), key=lambda t: t.seconds, reverse=True)
    return [f"`{t.nodeid}` took {t.seconds:.1f} s (over {limit:g} s) and gives no reason: add "
            f'@pytest.mark.slow(reason="...") saying why it needs that long' for t in slow]


def _wall_line(name: str, seconds: float, budget: float | None) -> str:
    if budget is None:
        return f"- wall time, {name}: {seconds:.1f} s"
    verdict = f"OVER, {seconds / budget:.2f}x" if seconds > budget else "within"
    return f"- wall time, {name}: {seconds:.1f} s (budget {budget:g} s: {verdict})"


def to_markdown(rows: list[dict], wall_seconds: dict[str, float], notes: list[str] = (),
                slowest_tests: list[dict] = (), budgets: dict[str, float] | None = None,
                findings: list[str] = ()) -> str:
    """The table; `budgets` (wall name -> seconds allowed) puts each step beside its budget, and each
    finding (a step over budget, a missing budget row) is listed under the wall times."""
    budgets = budgets or {}
    lines = ["| layer | tests | failed | seconds | compile seconds | CPU seconds |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        cpu = f"{r['cpu_seconds']:.1f}" if r.get("cpu_seconds") else ""
        lines.append(f"| {r['layer']} | {r['tests']} | {r['failed']} | {r['seconds']:.1f} | {r['compile_seconds']:.1f} | {cpu} |")
    lines.append("")
    lines += [_wall_line(name, seconds, budgets.get(name)) for name, seconds in wall_seconds.items()]
    lines += [f"- **time finding**: {finding}" for finding in findings]
    lines += [f"- {note}" for note in notes]
    if slowest_tests:
        lines += ["", "Slowest tests:", "", "| test | layer | seconds | compile seconds | CPU seconds | why slow |",
                  "|---|---|---:|---:|---:|---|"]
        lines += [f"| `{t['test']}` | {t['layer']} | {t['seconds']:.1f} | {t['compile_seconds']:.1f} | "
                  f"{t.get('cpu_seconds', 0.0):.1f} | {t.get('slow_reason', '')} |" for t in slowest_tests]
    return "\n".join(lines) + "\n"


def read_tests(path: Path) -> list[TestTime]:
    return [TestTime(**t) for t in json.loads(Path(path).read_text())["tests"]]


def write_tests(path: Path, tests: list[TestTime]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tests": [asdict(t) for t in tests]}, indent=1) + "\n")


def write_table(out_dir: Path, rows: list[dict], wall_seconds: dict[str, float], notes: list[str] = (),
                slowest_tests: list[dict] = (), budgets: dict[str, float] | None = None,
                findings: list[str] = ()) -> str:
    """reports/gate-time.md and .json; returns the markdown."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(rows, wall_seconds, notes, slowest_tests, budgets, findings)
    (out_dir / "gate-time.md").write_text("# Time to verdict\n\n" + markdown)
    (out_dir / "gate-time.json").write_text(json.dumps({"layers": rows, "wall_seconds": wall_seconds, "notes": list(notes),
                                                        "slowest": list(slowest_tests), "budgets": budgets or {},
                                                        "findings": list(findings)}, indent=1) + "\n")
    return markdown
