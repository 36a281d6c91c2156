"""The plot of the tasks whose items are matched one to one (segment everything's masks, the concept task's
detections): the union mean mask IoU per stage, and the items each stage lost and gained."""

from __future__ import annotations

from pathlib import Path

from parity.compare.gates import StageResult
from parity.report.verdicts import VERDICT_COLORS


def plot_union_and_unmatched(results: list[StageResult], path: Path, unmatched: str = "masks") -> None:
    """The union mean per stage, and beside it the `unmatched` (masks, detections) lost and new per stage."""
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
    ax_count.set_title(f"unmatched {unmatched}")
    ax_count.legend()
    for ax in (ax_iou, ax_count):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
