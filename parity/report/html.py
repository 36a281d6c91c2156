"""reports/<task>/report.html: the gate's verdict as one self-contained page a reviewer reads in ten seconds.

No network, no script: styles inline, the plot and the mask pictures as base64 PNG. A verdict
banner, the stage table (each gate's value, limit and share of the limit used), the plot, and for
every failed or near-failing stage its worst items (annotations, images, object-frames) as pictures.
Every task writes one: what differs between them (the gate columns, the facts under the banner, the
pictures' captions) is the task's PageLayout, made by its report module.

Render a report to PNG with headless Chromium (what the docs screenshot is made with):

    python -m parity.html_report --screenshot reports/report.html docs/report-html.png
"""

from __future__ import annotations

import argparse
import base64
import html
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from parity.compare.gates import NEAR_FAILING, StageResult
from parity.report.verdicts import fmt, not_applicable_lines, overall_verdict, stage_verdict, stages_to_show

CHROMIUM_INSTALL = "apt-get install -y chromium"
WINDOW = (1280, 2000)
BANNER_CLASS = {"PASS": "pass", "FAIL": "fail", "NOT EXERCISED": "notex"}

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 24px 24px; color: #222; }
.banner { padding: 14px 18px; margin: 0 -24px 16px; color: #fff; }
.banner h1 { margin: 0; font-size: 30px; letter-spacing: 1px; }
.banner p { margin: 4px 0 0; }
.pass { background: #1e7b34; } .fail { background: #b3261e; } .notex { background: #b86e00; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; vertical-align: top; }
th:first-child, td:first-child, th.verdict, td.verdict { text-align: left; }
td small { white-space: nowrap; color: #555; display: block; }
td.gate-fail { background: #f9d6d3; } td.gate-near { background: #fde9c4; } td.gate-info { color: #888; }
td.v-pass { color: #1e7b34; font-weight: bold; } td.v-fail, td.v-error { color: #b3261e; font-weight: bold; }
td.v-notex { color: #b86e00; font-weight: bold; }
ul.facts { padding-left: 18px; margin: 0 0 8px; }
figure { margin: 8px 0 14px; } figcaption { color: #444; }
img.plot { max-width: 100%; } img.worst { display: block; border: 1px solid #ccc; }
.tie { background: #fde9c4; padding: 0 4px; border-radius: 3px; }
"""


@dataclass(frozen=True)
class Figure:
    """One worst item's picture on the page, with its caption (plain text)."""

    png: bytes
    caption: str
    near_tie: bool = False  # marked: the stage was compared with the golden's mask of the same index


@dataclass(frozen=True)
class PageLayout:
    """What a task's page shows inside the shared frame (banner, stage table, notes, plot, a section per
    failed or near-failing stage)."""

    kind: str  # the page's name: "parity report", "AMG parity report", ...
    facts: list[str]  # plain-text lines under the banner, escaped here (the note on limits is added after them)
    gate_labels: dict[str, str]  # the stage table's gate columns: metric -> label
    plot_alt: str
    plot_caption: str
    picture_note: str  # HTML above a stage's pictures
    figures: Callable[[StageResult], list[Figure]]  # a stage's pictures, worst first
    extra_column: tuple[str, str, int] | None = None  # (label, the summary key it shows, digits)


def _png(data: bytes, css_class: str, alt: str) -> str:
    src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return f'<img class="{css_class}" alt="{html.escape(alt)}" src="{src}">'


def _gate_cell(gate) -> str:
    if gate is None:
        return "<td>-</td>"
    status = "info" if not gate.gated else ("fail" if not gate.passed else ("near" if gate.near_failing else "ok"))
    sign = "≥" if gate.kind == "min" else "≤"
    note = "" if gate.gated else " (not gated)"
    return (f'<td class="gate-{status}">{fmt(gate.value)}'
            f"<small>{sign} {gate.limit:g} · {gate.ratio:.2f}×{note}</small></td>")


def _stage_row(result: StageResult, layout: PageLayout) -> str:
    verdict_class = {"pass": "v-pass", "fail": "v-fail", "error": "v-error", "not exercised": "v-notex"}[result.verdict]
    gates = {g.metric: g for g in result.gates}
    cells = "".join(_gate_cell(gates.get(metric)) for metric in layout.gate_labels)
    if layout.extra_column is not None:
        _, key, digits = layout.extra_column
        cells += f"<td>{fmt((result.summary or {}).get(key), digits)}</td>"
    return (f"<tr><td>{html.escape(result.stage)}</td><td class=\"verdict {verdict_class}\">"
            f"{html.escape(stage_verdict(result))}</td>{cells}</tr>")


def _stage_section(result: StageResult, layout: PageLayout) -> str:
    """What went wrong (or nearly) in one stage, with its worst items as pictures."""
    failing = bool(result.failures)
    parts = [f"<h2>{html.escape(result.stage)}: {'what failed' if failing else 'near the limit'}</h2>", "<ul>"]
    for gate in result.failures + result.near_failing:
        parts.append(f"<li>{html.escape(gate.describe())} ({gate.ratio:.2f} of the limit)</li>")
    parts.append("</ul>")
    figures = layout.figures(result) if not result.error else []
    if figures:
        parts.append(f"<p>{layout.picture_note}</p>")
    for figure in figures:
        tie = ' <span class="tie">near tie</span>' if figure.near_tie else ""
        parts.append(f"<figure>{_png(figure.png, 'worst', figure.caption)}"
                     f"<figcaption>{html.escape(figure.caption)}{tie}</figcaption></figure>")
    return "\n".join(parts)


def _proofs(results: list[StageResult]) -> str:
    """What shows each switch of each stage ran (parity.checks.switch_proofs), folded: a reviewer opens it to check."""
    items = [f"<li><b>{html.escape(r.stage)}</b> {html.escape(proof)}</li>" for r in results for proof in r.exercised]
    return f"<details><summary>switch proofs</summary><ul>{''.join(items)}</ul></details>" if items else ""


def render_html(header: dict, results: list[StageResult], plot_png: bytes, layout: PageLayout) -> str:
    verdict = overall_verdict(results)
    passed = sum(r.passed for r in results)
    counts = {v: [r.stage for r in results if r.verdict == v] for v in ("fail", "error", "not exercised")}
    summary = f"{passed} of {len(results)} stages pass." + "".join(
        f" {label}: {', '.join(names)}." for label, names in
        (("Failed", counts["fail"]), ("Could not run", counts["error"]), ("Not exercised", counts["not exercised"])) if names)
    title = f"{header['model_type']} ({header['checkpoint']}) on {header['dataset']}"
    facts = [
        f"golden: <code>{html.escape(str(header['golden']))}</code> (made on {html.escape(str(header['golden_device']))}, "
        f"torch {html.escape(str(header['golden_torch']))})",
        *(html.escape(fact) for fact in layout.facts),
        "under each value: its limit and the share of the limit it uses (×): value / limit for an error bound, "
        f"IoU lost / IoU loss allowed for an IoU floor; above 1× fails, {NEAR_FAILING:.1f}× and up is "
        "<b>near-failing</b> and shown with pictures like a failure",
    ]
    rows = "\n".join(_stage_row(r, layout) for r in results)
    labels = [*layout.gate_labels.values(), *([layout.extra_column[0]] if layout.extra_column else [])]
    heads = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    notes = [f"<li><b>{html.escape(r.stage)}</b> not exercised: {html.escape(reason)}</li>"
             for r in results for reason in r.not_exercised]
    notes += [f"<li><b>{html.escape(r.stage)}</b> {html.escape(line)}</li>" for r in results for line in not_applicable_lines(r)]
    notes += [f"<li><b>{html.escape(r.stage)}</b> could not run: {html.escape(r.error)}</li>" for r in results if r.error]
    # errors and unexercised switches are the notes above; a section is about gates
    shown = [r for r in stages_to_show(results) if r.failures or r.near_failing]
    body = [
        f'<div class="banner {BANNER_CLASS[verdict]}"><h1>{verdict}</h1><p>{html.escape(summary)}</p></div>',
        f"<p><b>{html.escape(layout.kind)}</b>: {html.escape(title)}</p>",
        '<ul class="facts">' + "".join(f"<li>{f}</li>" for f in facts) + "</ul>",
        f"<table><tr><th>stage</th><th class='verdict'>verdict</th>{heads}</tr>\n{rows}\n</table>",
        ("<ul>" + "".join(notes) + "</ul>") if notes else "",
        _proofs(results),
        f"<figure>{_png(plot_png, 'plot', layout.plot_alt)}<figcaption>{layout.plot_caption}</figcaption></figure>",
        *(_stage_section(r, layout) for r in shown),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(layout.kind)} {verdict}: {html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(part for part in body if part) + "\n</body></html>\n")


# --- headless Chromium: the screenshot for docs, and the browser test ------------------------------

def find_chromium() -> str | None:
    return next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None)


def run_chromium(page: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Headless Chromium on a local file, with everything that would reach the network switched off."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError(f"no Chromium found; install it with `{CHROMIUM_INSTALL}`")
    with tempfile.TemporaryDirectory() as profile:
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   f"--user-data-dir={profile}", *args, Path(page).resolve().as_uri()]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)


def screenshot(page: Path, png: Path, window: tuple[int, int] = WINDOW) -> None:
    run_chromium(page, f"--screenshot={Path(png).resolve()}", f"--window-size={window[0]},{window[1]}")


def dump_dom(page: Path) -> str:
    """The page's DOM after Chromium rendered it."""
    return run_chromium(page, "--dump-dom").stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parity.html_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screenshot", nargs=2, metavar=("HTML", "PNG"), required=True,
                        help="render a report.html to a PNG with headless Chromium")
    parser.add_argument("--window", default=f"{WINDOW[0]}x{WINDOW[1]}", help="width x height in pixels")
    args = parser.parse_args(argv)
    page, png = map(Path, args.screenshot)
    if not page.is_file():
        print(f"error: {page} is not a file; make one with `python -m parity check`", file=sys.stderr)
        return 2
    try:
        width, height = (int(v) for v in args.window.lower().split("x"))
        if width < 1 or height < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--window {args.window!r}: give width x height in pixels, e.g. {WINDOW[0]}x{WINDOW[1]}")
    try:
        screenshot(page, png, (width, height))
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        what = "timed out" if isinstance(err, subprocess.TimeoutExpired) else f"exited with {err.returncode}"
        print(f"error: Chromium {what} rendering {page}; its stderr:\n{stderr.strip() or '(empty)'}\n"
              f"a broken or partial install is fixed with `{CHROMIUM_INSTALL}`", file=sys.stderr)
        return 2
    print(f"wrote {png}")
    return 0
