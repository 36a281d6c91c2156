import numpy as np
import pytest

from parity.compare.metrics import IouSummary, logits_error, mask_iou, miou_vs_ground_truth, summarize_ious


def _columns(start, stop, shape=(4, 8)):
    mask = np.zeros(shape, dtype=bool)
    mask[:, start:stop] = True
    return mask


def test_mask_iou_identical_and_disjoint():
    assert mask_iou(_columns(0, 4), _columns(0, 4)) == 1.0
    assert mask_iou(_columns(0, 4), _columns(4, 8)) == 0.0


def test_mask_iou_partial_overlap_exact():
    assert mask_iou(_columns(0, 4), _columns(0, 8)) == 0.5  # a inside b, half its size
    assert mask_iou(_columns(0, 4), _columns(2, 6)) == pytest.approx(1 / 3)  # 2 shared of 6 columns


def test_mask_iou_empty_masks():
    empty = np.zeros((4, 8), dtype=bool)
    assert mask_iou(empty, empty) == 1.0
    assert mask_iou(empty, _columns(0, 1)) == 0.0


def test_mask_iou_rejects_shape_mismatch_naming_both():
    with pytest.raises(ValueError, match=r"\(4, 8\) vs \(8, 4\)"):
        mask_iou(_columns(0, 4), np.zeros((8, 4), dtype=bool))


def test_mask_iou_refuses_logits():
    with pytest.raises(TypeError, match="boolean"):
        mask_iou(np.ones((4, 8), dtype=np.float32), _columns(0, 4))


def test_summarize_ious_exposes_the_tail():
    summary = summarize_ious([1.0] * 18 + [0.5, 0.2])
    assert summary.count == 20
    assert summary.min == 0.2
    assert summary.mean == pytest.approx((18 + 0.7) / 20)
    assert summary.n_below_half == 1  # 0.5 itself is not below half
    # numpy's linear interpolation: rank 0.05 * 19 = 0.95 between 0.2 and 0.5
    assert summary.p5 == pytest.approx(0.2 + 0.95 * 0.3)
    assert isinstance(summary, IouSummary)


def test_summarize_ious_refuses_nothing():
    with pytest.raises(ValueError):
        summarize_ious([])


def test_logits_error_exact_and_scaled():
    ref = np.array([3.0, 4.0])
    assert logits_error(ref, ref) == {"rel_l2": 0.0, "cosine": pytest.approx(1.0), "max_abs": 0.0}
    off = logits_error(np.array([3.0, 4.5]), ref)
    assert off["rel_l2"] == pytest.approx(0.1)
    assert off["max_abs"] == 0.5
    assert off["cosine"] == pytest.approx(27 / (5 * np.sqrt(29.25)))
    doubled = logits_error(2 * ref, ref)
    assert doubled["rel_l2"] == pytest.approx(1.0)
    assert doubled["cosine"] == pytest.approx(1.0)


def test_logits_error_computes_in_float64():
    # Squaring these in float16 overflows (300^2 * 1000 > 65504); the error must stay finite and exact.
    ref = np.full(1000, 300, dtype=np.float16)
    assert logits_error(ref, ref)["rel_l2"] == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("side", ["pred", "ref"])
def test_logits_error_non_finite_fails_loudly(bad, side):
    clean = np.ones((2, 3), dtype=np.float32)
    dirty = clean.copy()
    dirty[1, 2] = bad
    pred, ref = (dirty, clean) if side == "pred" else (clean, dirty)
    error = logits_error(pred, ref)
    assert error == {"rel_l2": float("inf"), "cosine": -1.0, "max_abs": float("inf")}


def test_logits_error_zero_reference():
    zeros = np.zeros(4)
    assert logits_error(zeros, zeros)["rel_l2"] == 0.0
    assert logits_error(zeros, zeros)["cosine"] == 1.0
    assert logits_error(np.ones(4), zeros)["rel_l2"] == float("inf")
    assert logits_error(np.ones(4), zeros)["cosine"] == 0.0


def test_logits_error_shape_mismatch():
    with pytest.raises(ValueError, match=r"\(2,\) vs \(3,\)"):
        logits_error(np.zeros(2), np.zeros(3))


def test_miou_vs_ground_truth_overall_and_per_category():
    result = miou_vs_ground_truth([(2, 0.0), (1, 1.0), (1, 0.5)])
    assert result["mean"] == pytest.approx(0.5)
    assert result["count"] == 3
    assert result["per_category"] == {1: {"mean": 0.75, "count": 2}, 2: {"mean": 0.0, "count": 1}}
    assert list(result["per_category"]) == [1, 2]


def test_miou_vs_ground_truth_refuses_nothing():
    with pytest.raises(ValueError):
        miou_vs_ground_truth([])
