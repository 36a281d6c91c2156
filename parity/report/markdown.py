"""The gate's report: a markdown table people read, JSON machines read, JUnit XML for CI, and a plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from xml.sax.saxutils import escape

from parity.check import StageResult


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
    """Delete the report files a check writes, so none of a previous run outlives a failed or crashed one."""
    for name in REPORT_FILES:
        (folder / name).unlink(missing_ok=True)


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


def verdict_line(results: list[StageResult]) -> str:
    """The report's first line: the verdict, how many stages pass, which failed and which did not exercise."""
    failed = [r.stage for r in results if r.blocks]
    unexercised = [r.stage for r in results if r.verdict == "not exercised"]
    return (f"**{overall_verdict(results)}**: {sum(r.passed for r in results)} of {len(results)} stages pass."
            + (" Failed: " + ", ".join(failed) + "." if failed else "")
            + (" Not exercised (a switch did not run; gates passed): " + ", ".join(unexercised) + "."
               if unexercised else ""))


def render_markdown(header: dict, results: list[StageResult]) -> str:
    lines = [
        f"# parity report: {header['model_type']} ({header['checkpoint']}) on {header['dataset']}",
        "",
        verdict_line(results),
        "",
        f"- golden: `{header['golden']}` (made on {header['golden_device']}, torch {header['golden_torch']})",
        f"- this run: {header['device']}, torch {header['torch']}; {header['annotations']} annotations, "
        f"{header['prompt']} prompts",
        f"- masks gated: {'yes' if header['masks_meaningful'] else 'no (seeded synthetic weights: mask IoU is reported, logits gate)'}",
        "",
        "| stage | verdict | logits rel L2 | score err | mask IoU mean | p5 | masks < 0.5 | best mask changed (near ties) | mIoU vs GT (golden) | img/s | first batch s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r.summary
        if r.error:
            lines.append(f"| {r.stage} | ERROR | - | - | - | - | - | - | - | - | - |")
            continue
        lines.append(
            f"| {r.stage} | {stage_verdict(r)} | {fmt(s['logits_rel_l2'])} | {fmt(s['score_max_abs_err'])} | "
            f"{fmt(s['mask_iou_mean'])} | {fmt(s['mask_iou_p5'])} | {s['masks_below_half']} | "
            f"{s['best_mask_changed']} ({s['best_mask_near_ties']}) | {fmt(s['miou_gt'])} ({fmt(s['miou_gt_golden'])}) | {fmt(s['steady_img_s'], 2)} | {fmt(s['first_batch_seconds'], 1)} |"
        )
    for r in stages_to_show(results):
        lines += failure_lines(r)
        if r.error:
            continue
        lines += [f"- not exercised (--require-gpu): {reason}" for reason in r.not_exercised if r.exercise_required]
        lines += ["", "Worst annotations (IoU of the stage's best mask vs the golden's; after a near tie, vs "
                  "the golden's mask of the same index):", ""]
        lines += ["| ann id | image id | IoU vs golden | best / golden best | score err |", "|---|---|---|---|---|"]
        lines += [
            f"| {w['ann_id']} | {w['image_id']} | {w['iou_vs_golden']:.4f} | {w['best']} / {w['golden_best']}{' (near tie)' if w['near_tie'] else ''} | {w['score_abs_err']:.4f} |"
            for w in r.worst
        ]
    lines += ["", "All gates per stage:", ""]
    for r in results:
        lines.append(f"- **{r.stage}**: " + ("; ".join(g.describe() for g in r.gates) if not r.error else r.error))
        lines += [f"  - not exercised: {reason}" for reason in r.not_exercised]
    return "\n".join(lines) + "\n"


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


def _draw_limits(ax, results: list[StageResult], metric: str) -> None:
    """Each stage's limit of `metric` as a black line across its bar (dashed where the gate only reports)."""
    for x, r in enumerate(results):
        gate = next((g for g in r.gates if g.metric == metric), None)
        if gate is not None:
            ax.hlines(gate.limit, x - 0.42, x + 0.42, colors="black", linewidths=1.6,
                      linestyles="solid" if gate.gated else "dashed")


def plot(results: list[StageResult], path: Path) -> None:
    """Logits error and mean mask IoU per stage, bars coloured by verdict, each stage's limit drawn across its bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ok = [r for r in results if not r.error]
    fig, (ax_l, ax_i) = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = [VERDICT_COLORS[r.verdict] for r in ok]
    names = [r.stage for r in ok]
    ax_l.bar(names, [r.summary["logits_rel_l2"] or 0 for r in ok], color=colors)
    _draw_limits(ax_l, ok, "logits_rel_l2")
    ax_l.set_title("logits rel. L2 error vs golden (lower is better)")
    ax_l.set_yscale("symlog", linthresh=1e-5)
    ax_i.bar(names, [r.summary["mask_iou_mean"] for r in ok], color=colors)
    _draw_limits(ax_i, ok, "mask_iou_mean")
    ax_i.set_title("mean mask IoU vs golden")
    ax_i.set_ylim(0, 1.02)
    for ax in (ax_l, ax_i):
        ax.tick_params(axis="x", rotation=30)
    fig.legend(handles=[Line2D([], [], color="black", lw=1.6, label="limit"),
                        Line2D([], [], color="black", lw=1.6, ls="dashed", label="limit (reported, not gated)")],
               loc="lower center", ncol=2, frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_payload(header: dict, results: list[StageResult]) -> dict:
    return {
        "header": header,
        "verdict": overall_verdict(results),
        "passed": not any(r.blocks for r in results),
        "stages": [
            {"stage": r.stage, "verdict": r.verdict, "passed": r.passed, "error": r.error,
             "not_exercised": r.not_exercised, "summary": r.summary, "worst": r.worst,
             "gates": [{**g.__dict__, "passed": g.passed, "ratio": g.ratio} for g in r.gates]}
            for r in results
        ],
    }


def write_reports(folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
    from parity.html_report import render_html  # here, not at the top: html_report builds on this module

    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in REPORT_FILES}
    paths["report.md"].write_text(render_markdown(header, results))
    paths["report.json"].write_text(json.dumps(report_payload(header, results), indent=2, default=str) + "\n")
    paths["junit.xml"].write_text(render_junit(results))
    plot(results, paths["report.png"])
    paths["report.html"].write_text(render_html(header, results, paths["report.png"].read_bytes()))
    return paths
