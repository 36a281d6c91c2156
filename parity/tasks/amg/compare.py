"""Gate a stage's generated masks against the AMG golden, per [amg.<precision>] in budgets.toml.

Images are keyed by image id; the stage must have run on exactly the golden's images (an image
missing on either side is an error, never silently dropped). Every gate is applied whatever the
weights: with weights that find nothing the golden refuses to be written (parity.tasks.amg.golden).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from parity.compare.gates import Gate, StageResult
from parity.tasks.amg.matching import DecisionBand, MatchSummary, match_image, summarize

if TYPE_CHECKING:  # the generator's module imports the model stack; matching needs only its thresholds
    from parity.tasks.amg.produce import AmgParams


def gates(summary: MatchSummary, limits: Mapping[str, float]) -> list[Gate]:
    return [
        Gate("union_iou_mean", summary.union_iou_mean, limits["min_union_iou_mean"], "min", True),
        Gate("matched_iou_mean", summary.matched_iou_mean, limits["min_matched_iou_mean"], "min", True),
        Gate("matched_iou_p5", summary.matched_iou_p5, limits["min_matched_iou_p5"], "min", True),
        Gate("score_max_abs_err", summary.predicted_iou_max_err, limits["max_score_abs_err"], "max", True),
    ]


def compare(stage: str, outputs: Mapping[int, Sequence[dict]], golden: Mapping[int, Sequence[dict]],
            limits: Mapping[str, float], params: AmgParams | None = None,
            alternates: Mapping[int, Sequence[dict]] | None = None) -> StageResult:
    """Match each image's stage records (generator records, COCO RLE) to the golden's and gate the figures.
    params: the generator's, whose decisions (score filters, box and crop NMS, crop-edge filter, small-region
    clean-up) decide which unmatched masks lie near a decision (within limits' max_score_abs_err,
    max_stability_shift or max_box_iou_shift of one: counted, not failed; parity.tasks.amg.matching.DecisionBand);
    None counts none so. alternates: per image, the masks the stage's NMS dropped at a
    near tie (parity.tasks.amg.alternates), which a golden mask may be paired with (swapped at NMS; with
    params only)."""
    if set(outputs) != set(golden):
        return StageResult(stage, [], {}, error=(
            f"the stage ran on images {sorted(outputs)} but the golden has {sorted(golden)}: "
            "different data; regenerate the golden"))
    band = None if params is None else DecisionBand.of(params, limits)
    alternates = alternates or {}
    summary = summarize([match_image(image_id, golden[image_id], outputs[image_id], band, alternates.get(image_id, ()))
                         for image_id in sorted(golden)])
    figures = summary.as_dict()
    worst = figures.pop("worst")
    return StageResult(stage, gates(summary, limits), figures, worst)
