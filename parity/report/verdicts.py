"""What every task's report says the same way: a stage's verdict and its cell, the verdict line, which
stages are detailed (one rule for every report), number formatting, JUnit XML and the JSON payload."""

from __future__ import annotations

import math
from pathlib import Path
from xml.sax.saxutils import escape

from parity.compare.gates import StageResult


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:.2e}" if 0 < abs(value) < 1e-3 else f"{value:.{digits}f}"
    return str(value)


REPORT_FILES = ("report.md", "report.json", "report.html", "junit.xml", "report.png")


def remove_reports(folder: Path) -> None:
    """Delete the report files a check writes and every picture of an earlier run (worst-*.png), so none
    of a previous run outlives a failed or crashed one."""
    for name in REPORT_FILES:
        (folder / name).unlink(missing_ok=True)
    for picture in folder.glob("worst-*.png"):
        picture.unlink()


def overall_verdict(results: list[StageResult]) -> str:
    """FAIL when a stage fails or errs, else NOT EXERCISED when a switch did not run, else PASS."""
    if any(r.blocks for r in results):
        return "FAIL"
    return "NOT EXERCISED" if any(r.verdict == "not exercised" for r in results) else "PASS"


def stage_verdict(result: StageResult) -> str:
    """The stage's verdict cell: "ERROR", "FAIL: <the gate furthest past its limit>", "NOT EXERCISED",
    "FAIL: not exercised (--require-gpu)" or "pass"."""
    if result.error:
        return "ERROR"
    if result.failures:
        worst = max(result.failures, key=lambda g: g.ratio)
        return f"FAIL: {worst.metric} {fmt(worst.value)} vs {'≥' if worst.kind == 'min' else '≤'} {worst.limit:g}"
    if result.not_exercised:
        return ("FAIL: not exercised (--require-gpu)" if result.exercise_required else "NOT EXERCISED")
    return "pass"


def stages_to_show(results: list[StageResult]) -> list[StageResult]:
    """The stages a report details: those that fail the gate, then those near a limit (every report,
    markdown or HTML, point or AMG, shows the same ones)."""
    return [r for r in results if r.blocks] + [r for r in results if not r.blocks and r.near_failing]


def failure_lines(result: StageResult) -> list[str]:
    """A failed (or near-failing) stage's section heading and its failed (or near-failing) gates with how
    far they use the limit, or why it could not run."""
    if not result.blocks:
        return ["", f"## {result.stage}: near the limit", ""] + [
            f"- {g.describe()} ({g.ratio:.2f}x the limit)" for g in result.near_failing]
    lines = ["", f"## {result.stage}: what failed", ""]
    if result.error:
        return [*lines, f"- could not run: {result.error}"]
    return lines + [f"- {g.describe()} ({g.ratio:.2f}x the limit)" for g in result.failures]


def all_gates_lines(results: list[StageResult]) -> list[str]:
    """The end of every task's report: each stage's gates (or why it could not run) and its switch lines."""
    lines = ["", "All gates per stage:", ""]
    for r in results:
        lines.append(f"- **{r.stage}**: " + ("; ".join(g.describe() for g in r.gates) if not r.error else r.error))
        lines += switch_lines(r)
    return lines


def switch_lines(result: StageResult) -> list[str]:
    """What the stage's switches did, one line each: the proof that a switch ran, that it did not, or why
    the task does not read it (markdown sub-items of the stage in every task's report)."""
    return ([f"  - exercised: {proof}" for proof in result.exercised]
            + [f"  - not exercised: {reason}" for reason in result.not_exercised]
            + [f"  - {line}" for line in not_applicable_lines(result)])


def not_applicable_lines(result: StageResult) -> list[str]:
    return [f"not applicable to this task: {switch} ({why})" for switch, why in result.not_applicable.items()]


def verdict_line(results: list[StageResult]) -> str:
    """The report's first line: the verdict, how many stages pass, which failed and which did not exercise."""
    failed = [r.stage for r in results if r.blocks]
    unexercised = [r.stage for r in results if r.verdict == "not exercised"]
    return (f"**{overall_verdict(results)}**: {sum(r.passed for r in results)} of {len(results)} stages pass."
            + (" Failed: " + ", ".join(failed) + "." if failed else "")
            + (" Not exercised (a switch did not run; gates passed): " + ", ".join(unexercised) + "."
               if unexercised else ""))


def render_junit(results: list[StageResult]) -> str:
    def attr(text: str) -> str:
        return escape(text, {chr(34): "&quot;"})

    cases = []
    for r in results:
        body = ""
        if r.error:
            body = f'<error message="{attr(r.error)}"/>'
        elif r.verdict == "fail":
            text = "; ".join([g.describe() for g in r.failures] + [f"not exercised: {x}" for x in r.not_exercised])
            body = f'<failure message="{attr(text)}">{escape(text)}</failure>'
        elif r.verdict == "not exercised":
            body = f'<skipped message="{attr("not exercised: " + "; ".join(r.not_exercised))}"/>'
        seconds = r.summary.get("seconds", 0.0) if r.summary else 0.0
        cases.append(f'  <testcase classname="parity" name="{escape(r.stage)}" time="{seconds:.3f}">{body}</testcase>')
    failures = sum(r.verdict == "fail" for r in results)
    errors = sum(r.verdict == "error" for r in results)
    skipped = sum(r.verdict == "not exercised" for r in results)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'<testsuite name="parity" tests="{len(results)}" failures="{failures}" errors="{errors}" skipped="{skipped}">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )


VERDICT_COLORS = {"pass": "tab:green", "not exercised": "tab:orange", "fail": "tab:red"}


def report_payload(header: dict, results: list[StageResult]) -> dict:
    return {
        "header": header,
        "verdict": overall_verdict(results),
        "passed": not any(r.blocks for r in results),
        "stages": [
            {"stage": r.stage, "verdict": r.verdict, "passed": r.passed, "error": r.error,
             "not_exercised": r.not_exercised, "exercised": r.exercised, "not_applicable": r.not_applicable,
             "summary": r.summary, "worst": r.worst,
             "gates": [{**g.__dict__, "passed": g.passed, "ratio": g.ratio} for g in r.gates]}
            for r in results
        ],
    }


