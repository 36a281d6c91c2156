"""The AMG check's report: the same files as the point gate (markdown, JSON, JUnit XML, plot, and the HTML
page of parity/report/html.py with this task's PageLayout).

Every figure is over all images; the worst images of a failed or near-failing stage are listed with
their counts and shown as pictures (worst-<stage>-image<id>.png beside report.md, linked from it, and on
the page).
"""

from __future__ import annotations

from pathlib import Path

from parity.compare.gates import StageResult
from parity.report.files import write_report_files
from parity.report.html import Figure, PageLayout
from parity.report.plots import plot_union_and_unmatched
from parity.report.verdicts import (
    all_gates_lines,
    failure_lines,
    fmt,
    stage_verdict,
    stages_to_show,
    verdict_line,
)
from parity.tasks.amg.matching import MATCH_IOU

COLUMNS = ("union IoU mean", "matched IoU mean", "matched p5", "golden / stage masks", "matched (swapped at NMS)",
           "lost (near a decision)", "new (near a decision)",
           "images with another count", "score err (same prompt)", "stability err (not gated)", "ms/img")


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
             f"{s['count_changed_images']} of {s['images']}",
             fmt(s["predicted_iou_max_err"]) + (f" ({s['other_prompt']} across prompts)" if s["other_prompt"] else ""),
             fmt(s["stability_max_err"]), fmt(s.get("ms_per_image"), 1)]
    return f"| {r.stage} | {stage_verdict(r)} | " + " | ".join(str(c) for c in cells) + " |"


def facts(header: dict) -> list[str]:
    """The run's facts under the verdict, after the golden's (plain text; markdown and the page show them)."""
    params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in header["amg_params"].items())
    return [
        f"this run: {header['device']}, torch {header['torch']}; points_per_batch {header['points_per_batch']}",
        f"generator: {params}",
        f"masks matched one to one per image by mask IoU (pairs at IoU <= {MATCH_IOU:g} unmatched); "
        "the union mean counts every lost and new mask as IoU 0 but those near a decision (on the side that kept "
        "them, within the stage's tolerance of one of the generator's decisions: pred_iou_thresh, "
        "stability_score_thresh, box NMS, crop NMS, the crop-edge filter, min_mask_region_area's clean-up and "
        "its NMS, or dropped by NMS there for a mask near one on the other side: counted, not failed); "
        "a golden mask fitted better by a mask the stage's NMS dropped at a near tie is paired with that one "
        "(swapped at NMS) and the stage's mask kept in its place counted near a decision; "
        "scores are compared between masks of the same prompt (grid point and crop) only: a pair whose masks "
        "answer different prompts holds two predictions, matched but not scored; "
        "no image is left out of any figure",
    ]


def render_markdown(header: dict, results: list[StageResult]) -> str:
    lines = [
        f"# AMG parity report: {header['model_type']} ({header['checkpoint']}) on {header['dataset']}",
        "",
        verdict_line(results),
        "",
        f"- golden: `{header['golden']}`, {header['golden_masks']} masks (made on {header['golden_device']}, "
        f"torch {header['golden_torch']})",
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


def _figures(result: StageResult) -> list[Figure]:
    return [Figure(result.pictures[w["image_id"]],
                   f"image {w['image_id']}: union IoU mean {w['union_iou_mean']:.4f}, {w['golden_masks']} golden / "
                   f"{w['stage_masks']} stage masks, {w['lost']} lost ({w['lost_near_decision']} near a decision), "
                   f"{w['new']} new ({w['new_near_decision']} near a decision)")
            for w in result.worst if w["image_id"] in result.pictures]


def html_layout(header: dict) -> PageLayout:
    """The AMG task's page (parity/report/html.py): its gates, its worst images."""
    return PageLayout(
        kind="AMG parity report",
        facts=[f"golden masks: {header['golden_masks']}", *facts(header)],
        gate_labels={"union_iou_mean": "union IoU mean", "matched_iou_mean": "matched IoU mean",
                     "matched_iou_p5": "matched IoU p5", "score_max_abs_err": "score err"},
        plot_alt="union mean mask IoU and unmatched masks per stage",
        plot_caption="Union mean mask IoU vs golden (lost and new masks count 0); masks lost and new per stage.",
        picture_note=("Worst images: the image, the golden's masks, the stage's (a matched pair shares a colour, a "
                      "mask with no match is red) and the difference of their unions."),
        figures=_figures,
        extra_column=("ms/img", "ms_per_image", 1),
    )


def write_reports(folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
    return write_report_files(folder, header, results, markdown=render_markdown(header, results),
                              plot=lambda path: plot_union_and_unmatched(results, path), layout=html_layout(header),
                              task="amg", picture_name=lambda result, image_id: picture_name(result.stage, image_id))
