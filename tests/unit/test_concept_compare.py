"""The concept task's comparison (parity.tasks.concept.compare) on hand-made detections: what passes, and each
planted defect (a detection lost or new away from the threshold, a mask shifted, a box moved, a detection moved
to another query, a score of a kept or an unkept query or a presence moved) failing its gate. The confidence
threshold is 0.5: scores at 0.52 and 0.48 are near it for bf16's tolerance (0.05)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from parity.compare.gates import load_thresholds
from parity.golden.rle import encode_rle
from parity.tasks.concept.compare import compare

LIMITS = load_thresholds(table="concept")["bf16"]
SIZE = 64


def _square(x0: int, y0: int, side: int = 16) -> np.ndarray:
    mask = np.zeros((SIZE, SIZE), bool)
    mask[y0:y0 + side, x0:x0 + side] = True
    return mask


def _detection(query: int, score: float, x0: int, y0: int, side: int = 16) -> dict:
    return {"query": query, "score": score, "box": [float(x0), float(y0), float(x0 + side), float(y0 + side)],
            "segmentation": encode_rle(_square(x0, y0, side))}


QUERIES = 8


def _pair(phrase: str, presence: float, detections: list[dict], near: dict[int, float] | None = None) -> dict:
    """A pair as produce.plain_pair makes it: every query scores 0.1 but those detected (and `near`'s)."""
    scores = [0.1] * QUERIES
    for query, score in (near or {}).items():
        scores[query] = score
    for d in detections:
        scores[d["query"]] = d["score"]
    return {"phrase": phrase, "presence": presence, "query_scores": scores, "detections": detections}


def _golden() -> dict[int, list[dict]]:
    """Two images, two phrases each; six detections, scores well above the threshold but one (0.52), and one
    query just below it (0.48)."""
    return {
        1: [_pair("circle", 0.9, [_detection(0, 0.9, 2, 2), _detection(3, 0.8, 30, 30)]),
            _pair("square", 0.2, [], near={4: 0.48})],
        2: [_pair("circle", 0.7, [_detection(1, 0.85, 10, 40)]),
            _pair("square", 0.95, [_detection(0, 0.9, 40, 2), _detection(5, 0.52, 20, 20), _detection(7, 0.75, 2, 44)])],
    }


def _drop(pair: dict, index: int, score: float) -> None:
    """The stage no longer keeps the pair's detection `index`: its query scored `score`."""
    detection = pair["detections"].pop(index)
    pair["query_scores"][detection["query"]] = score


def _add(pair: dict, detection: dict) -> None:
    pair["detections"].append(detection)
    pair["query_scores"][detection["query"]] = detection["score"]


def _check(stage: dict[int, list[dict]]):
    return compare("bf16", stage, _golden(), LIMITS)


def _failed(result) -> set[str]:
    return {g.metric for g in result.failures}


def test_the_golden_against_itself_passes_with_every_figure_exact():
    result = _check(_golden())
    assert result.passed and not result.failures
    s = result.summary
    assert (s["union_iou_mean"], s["matched_iou_mean"], s["box_iou_p5"]) == (1.0, 1.0, 1.0)
    assert (s["matched"], s["lost"], s["new"], s["pairs"], s["count_changed_pairs"]) == (6, 0, 0, 4, 0)
    assert s["score_max_abs_err"] == 0.0 and s["presence_max_abs_err"] == 0.0


def test_a_detection_lost_near_the_threshold_is_counted_not_failed():
    stage = _golden()
    _drop(stage[2][1], 1, 0.49)  # query 5 from 0.52 to 0.49: moved within bf16's 0.05, across the threshold
    result = _check(stage)
    assert result.passed, _failed(result)
    assert (result.summary["lost"], result.summary["lost_near_decision"]) == (1, 1)
    assert result.summary["union_iou_mean"] == 1.0


def test_a_detection_lost_far_from_the_threshold_fails():
    stage = _golden()
    _drop(stage[1][0], 1, 0.3)  # query 3 from 0.8
    result = _check(stage)
    assert {"union_iou_mean", "score_max_abs_err"} <= _failed(result)
    assert result.summary["lost_near_decision"] == 0
    assert result.worst[0]["image_id"] == 1 and result.worst[0]["lost_queries"] == [3]


def test_a_new_detection_near_the_threshold_is_counted_not_failed():
    stage = _golden()
    _add(stage[1][1], _detection(4, 0.52, 40, 40))  # query 4 from 0.48
    result = _check(stage)
    assert result.passed and result.summary["new_near_decision"] == 1


def test_a_new_detection_far_from_the_threshold_fails():
    stage = _golden()
    _add(stage[1][1], _detection(4, 0.9, 40, 40))
    assert {"union_iou_mean", "score_max_abs_err"} <= _failed(_check(stage))


def test_a_shifted_mask_fails():
    stage = _golden()
    moved = stage[2][1]["detections"][0]
    moved["segmentation"] = encode_rle(_square(44, 6))  # 4 pixels right and down of 16: IoU 0.6
    assert {"matched_iou_mean", "matched_iou_p5"} <= _failed(_check(stage))


def test_a_moved_box_fails():
    stage = _golden()
    stage[1][0]["detections"][0]["box"] = [6.0, 6.0, 22.0, 22.0]
    assert _failed(_check(stage)) == {"box_iou_p5"}


def test_a_detection_moved_to_another_query_fails():
    """The same mask answering another query is another model: lost at one query, new at another."""
    stage = _golden()
    moved = stage[1][0]["detections"][1]
    stage[1][0]["query_scores"][moved["query"]], stage[1][0]["query_scores"][6] = 0.1, moved["score"]
    moved["query"] = 6
    result = _check(stage)
    assert "union_iou_mean" in _failed(result)
    assert (result.summary["lost"], result.summary["new"]) == (1, 1)


def test_a_score_error_fails():
    stage = _golden()
    stage[2][0]["detections"][0]["score"] = stage[2][0]["query_scores"][1] = 0.85 - 0.06
    assert _failed(_check(stage)) == {"score_max_abs_err"}


def test_a_score_error_of_a_query_neither_side_kept_fails():
    stage = _golden()
    stage[1][1]["query_scores"][2] = 0.1 + 0.06
    assert _failed(_check(stage)) == {"score_max_abs_err"}


def test_a_presence_error_fails():
    stage = _golden()
    stage[1][1]["presence"] = 0.2 + 0.06  # a pair without detections still has its presence gated
    assert _failed(_check(stage)) == {"presence_max_abs_err"}


def test_other_images_or_phrases_are_an_error_never_a_pass():
    stage = _golden()
    del stage[2]
    assert _check(stage).error and not _check(stage).passed
    renamed = copy.deepcopy(_golden())
    renamed[1][0]["phrase"] = "star"
    with pytest.raises(ValueError, match="another question"):
        _check(renamed)


def test_nothing_kept_on_either_side_is_refused():
    empty = {1: [_pair("circle", 0.1, [])]}
    with pytest.raises(ValueError, match="nothing to compare"):
        compare("fp32", empty, empty, LIMITS)


def test_seeded_weights_gate_scores_presence_and_counts_not_masks():
    """Seeded weights' masks mean nothing: a shifted mask is reported, not failed; a count change away from the
    threshold, which the union mean would have failed, fails through its own gate."""
    shifted = _golden()
    shifted[2][1]["detections"][0]["segmentation"] = encode_rle(_square(44, 6))
    result = compare("bf16", shifted, _golden(), LIMITS, masks_meaningful=False)
    assert result.passed and result.summary["matched_iou_mean"] < LIMITS["min_matched_iou_mean"]
    lost = _golden()
    _drop(lost[1][0], 1, 0.3)
    result = compare("bf16", lost, _golden(), LIMITS, masks_meaningful=False)
    assert _failed(result) == {"count_changes_off_threshold", "score_max_abs_err"}
