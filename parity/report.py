"""The gate's report: a markdown table people read, JSON machines read, JUnit XML for CI, and a plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from xml.sax.saxutils import escape

from parity.check import StageResult


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:.2e}" if 0 < abs(value) < 1e-3 else f"{value:.{digits}f}"
    return str(value)


def _verdict(result: StageResult) -> str:
    if result.error:
        return "ERROR"
    if result.passed:
        return "pass"
    worst = max(result.failures, key=lambda g: _overshoot(g))
    return f"FAIL: {worst.metric} {_fmt(worst.value)} vs {'≥' if worst.kind == 'min' else '≤'} {worst.limit:g}"


def _overshoot(gate) -> float:
    """How far past its limit a failed gate is, as a ratio (for 'by how much')."""
    if gate.kind == "max":
        return gate.value / gate.limit if gate.limit else math.inf
    return gate.limit / gate.value if gate.value else math.inf


def render_markdown(header: dict, results: list[StageResult]) -> str:
    failed = [r for r in results if not r.passed]
    lines = [
        f"# parity report: {header['model_type']} ({header['checkpoint']}) on {header['dataset']}",
        "",
        f"**{'FAIL' if failed else 'PASS'}**: {len(results) - len(failed)} of {len(results)} stages pass."
        + (" Failed: " + ", ".join(r.stage for r in failed) + "." if failed else ""),
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
            f"| {r.stage} | {_verdict(r)} | {_fmt(s['logits_rel_l2'])} | {_fmt(s['score_max_abs_err'])} | "
            f"{_fmt(s['mask_iou_mean'])} | {_fmt(s['mask_iou_p5'])} | {s['masks_below_half']} | "
            f"{s['best_mask_changed']} ({s['best_mask_near_ties']}) | {_fmt(s['miou_gt'])} ({_fmt(s['miou_gt_golden'])}) | {_fmt(s['steady_img_s'], 2)} | {_fmt(s['first_batch_seconds'], 1)} |"
        )
    for r in failed:
        lines += ["", f"## {r.stage}: what failed", ""]
        if r.error:
            lines.append(f"- could not run: {r.error}")
            continue
        lines += [f"- {g.describe()} ({_overshoot(g):.2f}x the limit)" for g in r.failures]
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
        fallbacks = (r.summary or {}).get("kernel_fallbacks")
        if fallbacks:
            lines.append("  - fused rel-pos kernel fell back to the materialized-bias path: "
                         + ", ".join(f"{n}x {reason}" for reason, n in fallbacks.items()))
    return "\n".join(lines) + "\n"


def render_junit(results: list[StageResult]) -> str:
    cases = []
    for r in results:
        body = ""
        if r.error:
            body = f'<error message="{escape(r.error, {chr(34): "&quot;"})}"/>'
        elif not r.passed:
            text = "; ".join(g.describe() for g in r.failures)
            body = f'<failure message="{escape(text, {chr(34): "&quot;"})}">{escape(text)}</failure>'
        seconds = r.summary.get("seconds", 0.0) if r.summary else 0.0
        cases.append(f'  <testcase classname="parity" name="{escape(r.stage)}" time="{seconds:.3f}">{body}</testcase>')
    failures = sum(1 for r in results if not r.passed and not r.error)
    errors = sum(1 for r in results if r.error)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'<testsuite name="parity" tests="{len(results)}" failures="{failures}" errors="{errors}">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )


def plot(results: list[StageResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if not r.error]
    fig, (ax_l, ax_i) = plt.subplots(1, 2, figsize=(10, 3.5))
    colors = ["tab:green" if r.passed else "tab:red" for r in ok]
    names = [r.stage for r in ok]
    ax_l.bar(names, [r.summary["logits_rel_l2"] or 0 for r in ok], color=colors)
    ax_l.set_title("logits rel. L2 error vs golden (lower is better)")
    ax_l.set_yscale("symlog", linthresh=1e-5)
    ax_i.bar(names, [r.summary["mask_iou_mean"] for r in ok], color=colors)
    ax_i.set_title("mean mask IoU vs golden")
    ax_i.set_ylim(0, 1.02)
    for ax in (ax_l, ax_i):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


REPORT_FILES = ("report.md", "report.json", "junit.xml", "report.png")  # what write_reports writes


def write_reports(folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in REPORT_FILES}
    paths["report.md"].write_text(render_markdown(header, results))
    payload = {
        "header": header,
        "passed": all(r.passed for r in results),
        "stages": [
            {"stage": r.stage, "passed": r.passed, "error": r.error, "summary": r.summary, "worst": r.worst,
             "gates": [{**g.__dict__, "passed": g.passed} for g in r.gates]}
            for r in results
        ],
    }
    paths["report.json"].write_text(json.dumps(payload, indent=2, default=str) + "\n")
    paths["junit.xml"].write_text(render_junit(results))
    plot(results, paths["report.png"])
    return paths
