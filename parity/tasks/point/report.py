"""The point task's report: a markdown table people read, JSON machines read, JUnit XML for CI, a plot,
and the self-contained HTML page (parity/report/html.py)."""

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
    lines += all_gates_lines(results)
    return "\n".join(lines) + "\n"


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


def _figures(result: StageResult) -> list[Figure]:
    return [Figure(result.pictures[w["ann_id"]],
                   f"annotation {w['ann_id']} (image {w['image_id']}): IoU vs golden {w['iou_vs_golden']:.4f}, "
                   f"mask {w['best']} / golden {w['golden_best']}, score error {w['score_abs_err']:.4f}", w["near_tie"])
            for w in result.worst if w["ann_id"] in result.pictures]


def html_layout(header: dict) -> PageLayout:
    """The point task's page (parity/report/html.py): its gates, its worst annotations."""
    return PageLayout(
        kind="parity report",
        facts=[f"this run: {header['device']}, torch {header['torch']}; {header['annotations']} annotations, "
               f"{header['prompt']} prompts",
               "masks gated: " + ("yes" if header["masks_meaningful"] else
                                  "no (seeded synthetic weights: mask IoU is reported, logits gate)")],
        gate_labels={"logits_rel_l2": "logits rel L2", "score_max_abs_err": "score err", "mask_iou_mean": "mask IoU mean",
                     "mask_iou_p5": "mask IoU p5", "miou_gt_drop": "mIoU vs GT drop"},
        plot_alt="logits error and mask IoU per stage with limits",
        plot_caption="Black lines: each stage's limit (dashed: reported, not gated).",
        picture_note=("Worst annotations: the image crop with the prompt (yellow), the golden mask (blue), the stage's "
                      "mask (orange) and their difference (green: golden only, red: stage only). After a "
                      '<span class="tie">near tie</span> of the golden\'s scores the stage is compared with the '
                      "golden's mask of the same index."),
        figures=_figures,
        extra_column=("img/s", "steady_img_s", 2),
    )


def write_reports(folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
    return write_report_files(folder, header, results, markdown=render_markdown(header, results),
                              plot=lambda path: plot(results, path), layout=html_layout(header))
