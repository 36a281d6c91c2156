"""The concept check's report: the same files as the other tasks (markdown, JSON, JUnit XML, plot, and the HTML
page of parity/report/html.py with this task's PageLayout).

Every figure is over all (image, phrase) pairs; the worst pairs of a failed or near-failing stage are listed
with their counts and shown as pictures (worst-<stage>-<rank>.png beside report.md, linked from it, and on the
page). cgF1 against the data set's ground truth is reported beside each stage, never gated: it measures the
weights, which the golden's own cgF1 shows.
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

COLUMNS = ("union IoU mean", "matched IoU mean", "matched p5", "box IoU p5", "golden / stage detections",
           "lost (near the threshold)", "new (near the threshold)", "pairs with another count", "score err",
           "presence err", "cgF1 (not gated)", "ms/img")


def picture_name(stage: str, rank: int) -> str:
    return f"worst-{stage.replace('+', '-')}-{rank}.png"


def _row(r: StageResult) -> str:
    if r.error:
        return f"| {r.stage} | ERROR |" + " - |" * len(COLUMNS)
    s = r.summary
    cells = [fmt(s["union_iou_mean"]), fmt(s["matched_iou_mean"]), fmt(s["matched_iou_p5"]), fmt(s["box_iou_p5"]),
             f"{s['golden_detections']} / {s['stage_detections']}", f"{s['lost']} ({s['lost_near_decision']})",
             f"{s['new']} ({s['new_near_decision']})", f"{s['count_changed_pairs']} of {s['pairs']}",
             fmt(s["score_max_abs_err"]), fmt(s["presence_max_abs_err"]), fmt(s.get("cgf1"), 2),
             fmt(s.get("ms_per_image"), 1)]
    return f"| {r.stage} | {stage_verdict(r)} | " + " | ".join(str(c) for c in cells) + " |"


def facts(header: dict) -> list[str]:
    """The run's facts under the verdict, after the golden's (plain text; markdown and the page show them)."""
    truth = header.get("golden_ground_truth") or {}
    weights = ("" if header["masks_meaningful"] else
               " (seeded weights: the masks mean nothing, so the check gates numerics and cgF1 is near 0)")
    return [
        f"this run: {header['device']}, torch {header['torch']}",
        f"phrases on every image: {', '.join(header['phrases'])}; confidence threshold "
        f"{header['confidence_threshold']:g}{weights}",
        f"the golden's cgF1 against ground truth: {fmt(truth.get('cgf1'), 2)} (IL_MCC {fmt(truth.get('il_mcc'))}, "
        f"pmF1 {fmt(truth.get('pmf1'))})",
        "detections paired per (image, phrase) by decoder query; the union mean counts every lost and new "
        "detection as IoU 0 but those whose query's score moved by no more than the stage's score tolerance "
        "(near the decision: counted, not failed); the score error is over every query, kept or not; no pair is "
        "left out of any figure",
    ]


def _worst_lines(r: StageResult) -> list[str]:
    lines = ["", "Worst pairs (union IoU mean; matched as query, IoU):", "",
             "| image id | phrase | union IoU mean | golden / stage | lost (near) | new (near) | presence err | matched |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {w['image_id']} | {w['phrase']} | {w['union_iou_mean']:.4f} | {w['golden_detections']} / "
              f"{w['stage_detections']} | {w['lost']} ({w['lost_near_decision']}) | {w['new']} ({w['new_near_decision']}) | "
              f"{w['presence_err']:.2e} | " + " ".join(f"({q},{iou:.3f})" for q, iou in w["matched"]) + " |"
              for w in r.worst]
    return lines + ["", *(f"![{r.worst[rank]['phrase']} on image {r.worst[rank]['image_id']}]"
                          f"({picture_name(r.stage, rank)})" for rank in r.pictures)]


def render_markdown(header: dict, results: list[StageResult]) -> str:
    lines = [
        f"# Concept parity report: {header['model_type']} ({header['checkpoint']}) on {header['dataset']}",
        "",
        verdict_line(results),
        "",
        f"- golden: `{header['golden']}`, {header['golden_detections']} detections over {header['golden_pairs']} "
        f"(image, phrase) pairs (made on {header['golden_device']}, torch {header['golden_torch']})",
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
        lines += _worst_lines(r)
    lines += all_gates_lines(results)
    return "\n".join(lines) + "\n"


def _figures(result: StageResult) -> list[Figure]:
    return [Figure(png, f"{w['phrase']!r} on image {w['image_id']}: union IoU mean {w['union_iou_mean']:.4f}, "
                        f"{w['golden_detections']} golden / {w['stage_detections']} stage detections, {w['lost']} lost "
                        f"({w['lost_near_decision']} near the threshold), {w['new']} new ({w['new_near_decision']} near)")
            for rank, png in sorted(result.pictures.items()) for w in [result.worst[rank]]]


def html_layout(header: dict) -> PageLayout:
    """The concept task's page (parity/report/html.py): its gates, its worst pairs."""
    return PageLayout(
        kind="Concept parity report",
        facts=[f"golden detections: {header['golden_detections']}", *facts(header)],
        gate_labels={"union_iou_mean": "union IoU mean", "matched_iou_mean": "matched IoU mean",
                     "matched_iou_p5": "matched IoU p5", "box_iou_p5": "box IoU p5", "score_max_abs_err": "score err",
                     "presence_max_abs_err": "presence err"},
        plot_alt="union mean mask IoU and detections kept by one side per stage",
        plot_caption="Union mean mask IoU vs golden (lost and new detections count 0); detections lost and new per stage.",
        picture_note=("Worst (image, phrase) pairs: the image, the golden's detections, the stage's (the same query "
                      "shares a colour, a detection kept by one side only is red) and the difference of their unions."),
        figures=_figures,
        extra_column=("ms/img", "ms_per_image", 1),
    )


def write_reports(folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
    return write_report_files(folder, header, results, markdown=render_markdown(header, results),
                              plot=lambda path: plot_union_and_unmatched(results, path, unmatched="detections"),
                              layout=html_layout(header), task="concept",
                              picture_name=lambda result, rank: picture_name(result.stage, rank))
