"""The video check's report: markdown, JSON, JUnit XML, a plot and the HTML page (parity/report/html.py,
this task's PageLayout), as the point and AMG reports write them. The plot: J&F and the logits' error per
stage, and J against the frame index (drift shows as a falling line). A failed or near-failing stage's
worst object-frame is a picture beside report.md, linked from it
(worst-<stage>-clip<c>-object<o>-frame<t>.png), and on the page."""

from __future__ import annotations

from pathlib import Path

from parity.compare.gates import StageResult
from parity.report.files import write_report_files
from parity.report.html import Figure, PageLayout
from parity.report.verdicts import (
    VERDICT_COLORS,
    all_gates_lines,
    failure_lines,
    fmt,
    stage_verdict,
    stages_to_show,
    verdict_line,
)

COLUMNS = ("J&F mean", "J&F worst", "J mean", "F mean", "worst drift (J)", "objects lost", "logits rel L2",
           "object score err (rel)", "J&F vs GT (golden)", "s")


def picture_name(stage: str, worst: dict) -> str:
    return f"worst-{stage.replace('+', '-')}-clip{worst['video_id']}-object{worst['object_id']}-frame{worst['frame']}.png"


def _row(r: StageResult) -> str:
    if r.error:
        return f"| {r.stage} | ERROR |" + " - |" * len(COLUMNS)
    s = r.summary
    cells = [fmt(s["jf_mean"]), fmt(s["jf_worst"]), fmt(s["j_mean"]), fmt(s["f_mean"]), fmt(s["drift_j_worst"]),
             f"{s['objects_lost']} of {s['golden_present']}", fmt(s["logits_rel_l2"]), fmt(s["object_score_max_rel_err"]),
             f"{fmt(s['jf_gt_mean'])} ({fmt(s['jf_gt_mean_golden'])})", fmt(s["seconds"], 1)]
    return f"| {r.stage} | {stage_verdict(r)} | " + " | ".join(str(c) for c in cells) + " |"


def facts(header: dict) -> list[str]:
    """The run's facts under the verdict, after the golden's (plain text; markdown and the page show them)."""
    return [
        (f"this run: {header['device']}, torch {header['torch']}; input size {header['input_size']}; "
         f"prompts: {header['prompt_policy']}"),
        f"masks gated: {'yes' if header['masks_meaningful'] else 'no (seeded synthetic weights: J&F is reported, logits and object scores gate)'}",
        *([f"not built for video tracking, not run: {', '.join(header['not_built'])}"] if header.get("not_built") else []),
        ("J: region IoU; F: DAVIS boundary F (tolerance 0.008 of the diagonal); per object and frame vs the "
         "golden's mask; drift: mean J of the last 10 frames minus the first 10 where the golden has the object (worst object; gated as "
         "drift_j_fall, its fall, over objects on 40 such frames and more; a shorter track's last quarter and first, reported "
         "only); lost: J < 0.5 where the golden has the object"),
    ]


def render_markdown(header: dict, results: list[StageResult]) -> str:
    lines = [
        f"# video parity report: {header['model_type']} ({header['checkpoint']}) on {header['dataset']}",
        "",
        verdict_line(results),
        "",
        f"- golden: `{header['golden']}` (made on {header['golden_device']}, torch {header['golden_torch']})",
        *(f"- {fact}" for fact in facts(header)),
        "",
        "| stage | verdict | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    lines += [_row(r) for r in results]
    for r in stages_to_show(results):
        lines += failure_lines(r)
        if r.error:
            continue
        lines += ["", "Worst object-frames:", "", "| clip | object | frame | J | F | J&F vs GT |", "|---|---|---|---|---|---|"]
        lines += [f"| {w['video_id']} | {w['object_id']} | {w['frame']} | {w['j']:.4f} | {w['f']:.4f} | {w['jf_gt']:.4f} |"
                  for w in r.worst]
        lines += ["", *(f"![the worst object-frame]({picture_name(r.stage, r.worst[i])})" for i in r.pictures)]
    lines += ["", "J&F vs golden per object (clip/object: mean over frames):", ""]
    for r in results:
        if not r.error:
            lines.append(f"- **{r.stage}**: " + ", ".join(f"{k} {v:.4f}" for k, v in r.summary["jf_per_object"].items()))
    lines += all_gates_lines(results)
    return "\n".join(lines) + "\n"


def plot(results: list[StageResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if not r.error]
    names, colors = [r.stage for r in ok], [VERDICT_COLORS[r.verdict] for r in ok]
    fig, (ax_jf, ax_l, ax_drift) = plt.subplots(1, 3, figsize=(15, 3.5))
    ax_jf.bar(names, [r.summary["jf_mean"] for r in ok], color=colors)
    ax_jf.set_title("J&F mean vs golden")
    ax_jf.set_ylim(0, 1.02)
    ax_l.bar(names, [r.summary["logits_rel_l2"] for r in ok], color=colors)
    ax_l.set_yscale("symlog", linthresh=1e-5)
    ax_l.set_title("logits rel. L2 error vs golden")
    for ax in (ax_jf, ax_l):
        ax.tick_params(axis="x", rotation=30)
    for r in ok:
        ax_drift.plot(r.summary["j_by_frame"], label=r.stage, linewidth=1.2)
    ax_drift.set_title("J vs golden by frame (mean over objects)")
    ax_drift.set_xlabel("frame")
    if ok:
        ax_drift.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _figures(result: StageResult) -> list[Figure]:
    figures = []
    for i, png in sorted(result.pictures.items()):
        w = result.worst[i]
        figures.append(Figure(png, f"clip {w['video_id']}, object {w['object_id']}, frame {w['frame']}: J {w['j']:.4f}, "
                                   f"F {w['f']:.4f} vs golden; J&F vs ground truth {w['jf_gt']:.4f} "
                                   f"(the golden's {w['golden_jf_gt']:.4f})"))
    return figures


def html_layout(header: dict) -> PageLayout:
    """The video task's page (parity/report/html.py): its gates, its worst object-frame."""
    return PageLayout(
        kind="video parity report",
        facts=facts(header),
        gate_labels={"jf_mean": "J&F mean", "jf_worst": "J&F worst", "objects_lost": "objects lost",
                     "drift_j_fall": "drift (J fall)", "logits_rel_l2": "logits rel L2",
                     "object_score_max_rel_err": "object score err"},
        plot_alt="J&F and the logits' error per stage, and J against the frame index",
        plot_caption="J&F vs golden and the logits' error per stage; J vs golden by frame (drift shows as a falling line).",
        picture_note=("The worst object-frame: the frame, the golden's mask, the stage's, and where they differ (green: "
                      "golden only, red: stage only)."),
        figures=_figures,
        extra_column=("s", "seconds", 1),
    )


def write_reports(folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
    return write_report_files(folder, header, results, markdown=render_markdown(header, results),
                              plot=lambda path: plot(results, path), layout=html_layout(header), task="video",
                              picture_name=lambda result, i: picture_name(result.stage, result.worst[i]))
