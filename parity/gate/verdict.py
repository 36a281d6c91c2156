"""The last lines of a gate run: PASS or FAIL, then per step what passed, failed and was skipped (and
why), each check's stages with its worst figure, the time findings, and where the reports are.

Read from what the steps leave in the report folder (pytest's junit-<run>.xml, each check's
report.json), so it says what the steps found, not what the driver assumed.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from parity.report.verdicts import fmt

SKIP_REASONS_SHOWN = 3


@dataclass
class PytestRun:
    name: str
    tests: int = 0
    failed: int = 0  # failures and errors
    skipped: int = 0
    skip_reasons: Counter = field(default_factory=Counter)
    missing: bool = False  # no junit file: the run did not get as far as writing one

    @property
    def passed(self) -> int:
        return self.tests - self.failed - self.skipped


def read_junit(name: str, path: Path) -> PytestRun:
    run = PytestRun(name)
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        run.missing = True
        return run
    for case in root.iter("testcase"):
        run.tests += 1
        if case.find("failure") is not None or case.find("error") is not None:
            run.failed += 1
        elif (skip := case.find("skipped")) is not None:
            run.skipped += 1
            run.skip_reasons[_reason(skip.get("message", ""))] += 1
    return run


def _reason(message: str) -> str:
    """pytest's skip message without its location prefix ("Skipped: ..."), one line."""
    message = message.splitlines()[0] if message else "no reason given"
    return message.removeprefix("Skipped: ").strip() or "no reason given"


def pytest_line(run: PytestRun, code: int) -> str:
    if run.missing:
        return f"- pytest {run.name}: no results (exit {code}: it stopped before writing its report)"
    line = f"- pytest {run.name}: {run.passed} passed, {run.failed} failed, {run.skipped} skipped"
    if run.tests and run.skipped == run.tests:
        line += " (ALL skipped)"
    if run.skip_reasons:
        shown = run.skip_reasons.most_common(SKIP_REASONS_SHOWN)
        more = len(run.skip_reasons) - len(shown)
        line += "; skipped because: " + "; ".join(f"{n}x {reason}" for reason, n in shown)
        line += f"; and {more} other reason(s)" if more > 0 else ""
    return line


def check_line(name: str, report_json: Path, code: int) -> str:
    """'- check: PASS, 3 of 3 stages; worst: fp32+nt mask_iou_mean 0.9977 (0.23x its limit)'."""
    try:
        report = json.loads(report_json.read_text())
    except (OSError, ValueError):
        return f"- {name}: no report (exit {code}{': bad input' if code == 2 else ''}; its log says why)"
    stages = report["stages"]
    passed = sum(s["passed"] for s in stages)
    line = f"- {name}: {report['verdict']}, {passed} of {len(stages)} stages pass"
    gates = [(g["ratio"], s["stage"], g) for s in stages for g in s["gates"] if g["gated"]]
    if gates:
        ratio, stage, gate = max(gates, key=lambda item: item[0])
        line += f"; worst: {stage} {gate['metric']} {fmt(gate['value'])} ({ratio:.2f}x its limit)"
    failed = [s["stage"] for s in stages if s["verdict"] in ("fail", "error")]
    return line + (f"; failed: {', '.join(failed)}" if failed else "")


def render(verdict_code: int, runs: list[tuple[PytestRun, int]], checks: list[tuple[str, Path, int]],
           time_lines: list[str], report_dir: Path) -> str:
    word = {0: "PASS", 1: "FAIL", 2: "FAIL (bad input)"}[verdict_code]
    lines = [f"Verdict: {word}"]
    lines += [pytest_line(run, code) for run, code in runs]
    lines += [check_line(name, path, code) for name, path, code in checks]
    lines += [f"- time: {line}" for line in time_lines]
    # each check's page to open: its HTML where its task writes one (the point task), else its markdown
    pages = [next((str(p) for p in (report.with_suffix(".html"), report.with_suffix(".md")) if p.exists()), None)
             for _, report, _ in checks]
    lines.append(f"- reports: {', '.join(filter(None, pages)) or 'none written'}; time table {report_dir / 'gate-time.md'}")
    lines.append(f"Verdict: {word}")
    return "\n".join(lines)
