"""The AMG check's report: the same four files as the point gate (markdown, JSON, JUnit XML, plot).

Every figure is over all images; the worst images of a failed or near-failing stage are listed with
their counts and shown as pictures (worst-<stage>-image<id>.png beside report.md, linked from it).
"""

from __future__ import annotations

import json
from pathlib import Path

from parity.compare.gates import StageResult
from parity.report.verdicts import (
    VERDICT_COLORS,
    all_gates_lines,
    failure_lines,
    fmt,
    render_junit,
    report_payload,
    stage_verdict,
    stages_to_show,
    verdict_line,
)
from parity.tasks.amg.matching import MATCH_IOU

COLUMNS = ("union IoU mean", "matched IoU mean", "matched p5", "golden / stage masks", "matched (swapped at NMS)",
           "lost (near a decision)", "new (near a decision)",
           "images with another count", "score err", "stability err (not gated)", "ms/img")


def picture_name(stage: str, image_id: int) -> str:
    return f"worst-{stage.replace('+', '-')}-image{image_id}.png"


def _row(r: StageResult) -> str:
    if r.error:
        return f"| {r.stage} | ERROR |" + " - |" * len(COLUMNS)
    s = r.summary
    cells = [fmt(s["union_iou_mean"]), fmt(s["matched_iou_mean"]), fmt(s["matched_iou_p5"]),
             f"{s['golden_masks']} / {s['stage_masks']}", f"{s['matched']} ({s['swapped']})",
             f"{s['lost']} ({s['lost_near_decision']})",
             f"{s['new']} ({s['new_near_decision']})",
             f"{s['count_changed_images']} of {s['images']}", fmt(s["predicted_iou_max_err"]),
             fmt(s["stability_max_err"]), fmt(s.get("ms_per_image"), 1)]
    return f"| {r.stage} | {stage_verdict(r)} | " + " | ".join(str(c) for c in cells) + " |"


def render_markdown(header: dict, results: list[StageResult]) -> str:
    params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in header["amg_params"].items())
    lines = [
        f"# AMG parity report: {header['model_type']} ({header['checkpoint']}) on {header['dataset']}",
        "",
        verdict_line(results),
        "",
        f"- golden: `{header['golden']}`, {header['golden_masks']} masks (made on {header['golden_device']}, "
        f"torch {header['golden_torch']})",
        f"- this run: {header['device']}, torch {header['torch']}; points_per_batch {header['points_per_batch']}",
        f"- generator: {params}",
        f"- masks matched one to one per image by mask IoU (pairs at IoU <= {MATCH_IOU:g} unmatched); "
        "the union mean counts every lost and new mask as IoU 0 but those near a decision (on the side that kept "
        "them, a score within the stage's score tolerance above pred_iou_thresh or stability_score_thresh, or a "
        "box IoU with a mask scored as high within its box tolerance below box_nms_thresh: counted, not failed); "
        "a golden mask fitted better by a mask the stage's NMS dropped at a near tie is paired with that one "
        "(swapped at NMS) and the stage's mask kept in its place counted near a decision; "
        "no image is left out of any figure",
        "",
        "| stage | verdict | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    lines += [_row(r) for r in results]
    for r in stages_to_show(results):
        lines += failure_lines(r)
        if r.error:
            continue
        lines += [f"- not exercised (--require-gpu): {reason}" for reason in r.not_exercised if r.exercise_required]
        lines += ["", "Worst images (union IoU mean; pairs as golden index, stage index, IoU):", "",
                  "| image id | union IoU mean | golden / stage masks | lost (near a decision) | new (near a decision) "
                  "| swapped at NMS (not in pairs) | pairs |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {w['image_id']} | {w['union_iou_mean']:.4f} | {w['golden_masks']} / {w['stage_masks']} | "
                  f"{w['lost']} ({w['lost_near_decision']}) | {w['new']} ({w['new_near_decision']}) | {w['swapped']} | "
                  + " ".join(f"({g},{s},{iou:.3f})" for g, s, iou in w["pairs"]) + " |"
                  for w in r.worst]
        lines += ["", *(f"![image {image_id}]({picture_name(r.stage, image_id)})" for image_id in r.pictures)]
    lines += all_gates_lines(results)
    return "\n".join(lines) + "\n"


def plot(results: list[StageResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if not r.error]
    names = [r.stage for r in ok]
    colors = [VERDICT_COLORS[r.verdict] for r in ok]
    fig, (ax_iou, ax_count) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax_iou.bar(names, [r.summary["union_iou_mean"] for r in ok], color=colors)
    ax_iou.set_title("union mean mask IoU vs golden (lost/new = 0)")
    ax_iou.set_ylim(0, 1.02)
    x = range(len(ok))
    ax_count.bar([i - 0.2 for i in x], [r.summary["lost"] for r in ok], width=0.4, label="lost")
    ax_count.bar([i + 0.2 for i in x], [r.summary["new"] for r in ok], width=0.4, label="new")
    ax_count.set_xticks(list(x), names)
    ax_count.set_title("unmatched masks")
    ax_count.legend()
    for ax in (ax_iou, ax_count):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in ("report.md", "report.json", "junit.xml", "report.png")}
    paths["report.md"].write_text(render_markdown(header, results))
    payload = {"task": "amg", **report_payload(header, results)}
    paths["report.json"].write_text(json.dumps(payload, indent=2, default=str) + "\n")
    paths["junit.xml"].write_text(render_junit(results))
    plot(results, paths["report.png"])
    for r in results:
        for image_id, png in r.pictures.items():
            (folder / picture_name(r.stage, image_id)).write_bytes(png)
    return paths
