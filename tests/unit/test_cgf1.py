"""parity.compare.cgf1 against hand-derived values and against Meta's reference, sam3 0.1.4's
sam3/eval/cgf1_eval.py (facebookresearch/sam3 99d02f28, the same code), plus planted defects those cases catch.

The reference file is loaded on its own from the installed wheel: importing the sam3 package would build
its model code (torch) for nothing, and cgf1_eval.py needs only numpy, scipy, pycocotools and tqdm.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import numpy as np
import pycocotools.mask as mask_utils
import pytest

from parity.compare import cgf1 as cgf1_mod
from parity.compare.cgf1 import PhraseItem, compute_cgf1

SIZE = 24


def rle(y0: int, y1: int, x0: int, x1: int, size: int = SIZE) -> dict:
    """COCO RLE of the rectangle rows [y0, y1) x columns [x0, x1) (empty when y1 <= y0)."""
    mask = np.zeros((size, size), dtype=np.uint8, order="F")
    mask[y0:y1, x0:x1] = 1
    encoded = mask_utils.encode(mask)
    return {"size": [int(v) for v in encoded["size"]], "counts": encoded["counts"].decode("ascii")}


R1, R2, R3 = rle(0, 6, 0, 6), rle(10, 20, 10, 20), rle(0, 4, 12, 24)
DISJOINT = rle(20, 24, 0, 4)  # overlaps none of R1, R2, R3


def f1(tp: int, fp: int, fn: int) -> float:
    """The reference's F1 with its epsilons (cgf1_eval.py lines 404-414), for the derivations below."""
    p, r = tp / (tp + fp + 1e-4), tp / (tp + fn + 1e-4)
    return 2 * p * r / (p + r + 1e-4)


PERFECT = [
    PhraseItem(gt_masks=[R1], pred_masks=[R1], pred_scores=[0.9]),
    PhraseItem(gt_masks=[R2, R3], pred_masks=[R3, R2], pred_scores=[0.8, 0.7]),
    PhraseItem(gt_masks=[], pred_masks=[], pred_scores=[]),
]


SPLIT = [PhraseItem([rle(0, 8, 0, 8)], [rle(0, 8, 0, 4), rle(0, 8, 4, 8)], [0.9, 0.8]), PERFECT[2]]

# Columns of rows 0-9: G0 = 0-9, G1 = 3-8; D0 = 0-8, D1 = 0-2. IoU(D0, G0) = 90/100 = 0.9,
# IoU(D0, G1) = 60/90 = 2/3, IoU(D1, G0) = 30/100 = 0.3, IoU(D1, G1) = 0.
HUNGARIAN = [
    PhraseItem([rle(0, 10, 0, 10), rle(0, 10, 3, 9)], [rle(0, 10, 0, 9), rle(0, 10, 0, 3)], [0.9, 0.8]),
    PERFECT[2],
]


# --- (a) hand-made cases


def test_perfect_prediction_scores_100_up_to_the_reference_epsilons():
    # TP=3, FP=FN=0 at every IoU threshold: P = R = 3/3.0001, pmF1 = 2P^2/(2P+1e-4) = 0.99991667.
    # Image level TP=2, TN=1: MCC = (2*1 - 0)/(sqrt(2*2*1*1) + 1e-6) = 2/2.000001. cgF1 = 99.99162.
    result = compute_cgf1(PERFECT)
    assert result.tp == (3,) * 10 and result.fp == (0,) * 10 and result.fn == (0,) * 10
    assert (result.il_tp, result.il_fp, result.il_tn, result.il_fn) == (2, 0, 1, 0)
    assert result.pmf1 == pytest.approx(f1(3, 0, 0), rel=1e-12)
    assert result.il_mcc == pytest.approx(2 / 2.000001, rel=1e-12)
    assert result.cgf1 == pytest.approx(100 * f1(3, 0, 0) * 2 / 2.000001, rel=1e-12)
    assert result.cgf1 == pytest.approx(100, abs=0.01)


def test_mcc_is_zero_when_every_pair_is_positive():
    # No negative pair: TN + FP = 0, so the reference's MCC is 0/(0 + 1e-6) = 0 and so is cgF1.
    result = compute_cgf1(PERFECT[:2])
    assert result.pmf1 == pytest.approx(f1(3, 0, 0), rel=1e-12)
    assert result.il_mcc == 0.0 and result.cgf1 == 0.0


def test_all_miss():
    # Wrong place: TP=0 so P=R=0 and pmF1 = 0/1e-4 = 0; the image level is right (TP=1, TN=1, MCC ~ 1).
    wrong_place = compute_cgf1([PhraseItem([R1], [DISJOINT], [0.9]), PERFECT[2]])
    assert wrong_place.tp == (0,) * 10 and wrong_place.fp == (1,) * 10 and wrong_place.fn == (1,) * 10
    assert wrong_place.pmf1 == 0.0 and wrong_place.cgf1 == 0.0
    assert wrong_place.il_mcc == pytest.approx(1 / 1.000001, rel=1e-12)
    # Nothing predicted: image level FN=1, TN=1, so TP + FP = 0 and MCC = 0.
    nothing = compute_cgf1([PhraseItem([R1], [], []), PERFECT[2]])
    assert (nothing.il_tp, nothing.il_fp, nothing.il_tn, nothing.il_fn) == (0, 0, 1, 1)
    assert nothing.fn == (1,) * 10 and nothing.il_mcc == 0.0 and nothing.cgf1 == 0.0


def test_false_positive_on_a_negative_pair_lowers_only_il_mcc():
    # Two perfect positives, one empty negative, one negative with a confident mask:
    # image level TP=2, FP=1, TN=1, FN=0: MCC = (2*1 - 1*0)/(sqrt(3*2*2*1) + 1e-6) = 0.57735.
    # pmF1 keeps TP=2, FP=0 (a negative pair's predictions never reach its counts).
    clean = [PhraseItem([R1], [R1], [0.9]), PhraseItem([R2], [R2], [0.9]), PERFECT[2]]
    base = compute_cgf1(clean)
    dirty = compute_cgf1([*clean, PhraseItem([], [R3], [0.9])])
    assert base.il_mcc == pytest.approx(2 / 2.000001, rel=1e-12)
    assert dirty.il_mcc == pytest.approx(2 / (12**0.5 + 1e-6), rel=1e-12)
    assert dirty.pmf1 == base.pmf1 == pytest.approx(f1(2, 0, 0), rel=1e-12)
    assert dirty.fp == base.fp == (0,) * 10
    assert dirty.cgf1 == pytest.approx(100 * f1(2, 0, 0) * 2 / (12**0.5 + 1e-6), rel=1e-12)


def test_predictions_below_the_threshold_are_ignored_and_at_it_kept():
    # Score 0.49 on a positive pair (a miss) and 0.3 on the negative pair: dropped, so the result is PERFECT's.
    low = [
        PhraseItem([R1], [R1, DISJOINT], [0.9, 0.49]),
        PERFECT[1],
        PhraseItem([], [R3], [0.3]),
    ]
    assert compute_cgf1(low) == compute_cgf1(PERFECT)
    # The reference keeps score >= threshold (cgf1_eval.py line 254): 0.5 is a false positive at image level.
    at = compute_cgf1([*PERFECT, PhraseItem([], [R3], [0.5])])
    assert (at.il_tp, at.il_fp, at.il_tn, at.il_fn) == (2, 1, 1, 0)
    # A higher threshold drops the 0.9 prediction of item 0: image level FN, and R1 a false negative.
    high = compute_cgf1(PERFECT, threshold=0.95)
    assert (high.il_tp, high.il_fn) == (0, 2) and high.fn == (3,) * 10


def test_split_mask_counts_only_at_iou_half():
    # GT 8x8 (64 px), predicted as its two 8x4 halves: each IoU = 32/64 = 0.5 exactly. One half is matched.
    # IoU threshold 0.5 (IoU >= t): TP=1, FP=1, FN=0, F1 = 2PR/(P+R+1e-4) with P = 1/2.0001, R = 1/1.0001,
    # = 0.66658; thresholds 0.55..0.95: TP=0, F1=0. pmF1 = 0.66658/10; MCC = 1/1.000001 (TP=1, TN=1).
    result = compute_cgf1(SPLIT)
    assert result.tp == (1,) + (0,) * 9
    assert result.fp == (1,) + (2,) * 9
    assert result.fn == (0,) + (1,) * 9
    assert result.pmf1 == pytest.approx(f1(1, 1, 0) / 10, rel=1e-12)
    assert result.cgf1 == pytest.approx(100 * f1(1, 1, 0) / 10 / 1.000001, rel=1e-12)


def test_matching_maximises_summed_iou():
    # linear_sum_assignment picks D0-G1 + D1-G0 (2/3 + 0.3 = 0.967) over D0-G0 + D1-G1 (0.9 + 0): one TP
    # while 2/3 >= t, i.e. t = 0.5, 0.55, 0.6, 0.65, none above. Greedy highest-IoU-first would keep 0.9
    # and count a TP up to t = 0.9.
    result = compute_cgf1(HUNGARIAN)
    assert result.tp == (1,) * 4 + (0,) * 6
    assert result.fp == (1,) * 4 + (2,) * 6 and result.fn == result.fp


def test_crowd_ground_truth_is_ignored():
    # Only-crowd GT is a negative pair: a prediction on it is an image-level FP and no pmF1 count.
    only_crowd = compute_cgf1([PhraseItem([R1], [R1], [0.9], gt_crowd=[True]), *PERFECT])
    assert (only_crowd.il_tp, only_crowd.il_fp, only_crowd.il_tn) == (2, 1, 1)
    # Next to a real mask the crowd one is neither a miss nor an excuse: the prediction on it is an FP.
    mixed = compute_cgf1([PhraseItem([R1, R2], [R1, R2], [0.9, 0.9], gt_crowd=[False, True]), PERFECT[2]])
    assert mixed.tp == (1,) * 10 and mixed.fp == (1,) * 10 and mixed.fn == (0,) * 10


def test_mappings_are_accepted_and_as_dict_is_flat():
    result = compute_cgf1([{"gt_masks": [R1], "pred_masks": [R1], "pred_scores": [0.9]}, PERFECT[2]])
    assert result == compute_cgf1([PERFECT[0], PERFECT[2]])
    assert result.as_dict()["cgf1"] == result.cgf1 and result.as_dict()["tp"] == (1,) * 10


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (PhraseItem([R1], [rle(0, 2, 0, 2, size=SIZE + 1)], [0.9]), "different sizes"),
        (PhraseItem([R1], [R1, R2], [0.9]), "1 scores for 2 predicted masks"),
        (PhraseItem([R1], [R1], [float("nan")]), "non-finite"),
        (PhraseItem([R1, R2], [], [], gt_crowd=[True]), "1 crowd flags for 2 GT masks"),
        (PhraseItem([np.zeros((SIZE, SIZE), bool)], [], []), "COCO RLE"),
        ({"gt_masks": [R1], "pred_masks": [], "scores": []}, "fields"),
    ],
)
def test_malformed_input_is_refused(item, message):
    with pytest.raises(ValueError, match=message):
        compute_cgf1([item])


def test_no_items_is_refused():
    with pytest.raises(ValueError, match="no"):
        compute_cgf1([])


# --- (b) equality with the reference on seeded random cases


def random_items(seed: int, n_items: int = 8) -> list[PhraseItem]:
    """Rectangles on 24x24: jittered copies of the GT (IoU anywhere in 0..1), stray and empty masks,
    crowd GT, negative pairs, and scores at exactly 0.5 and just under it."""
    rng = np.random.default_rng(seed)

    def rect():
        y0, x0 = rng.integers(0, SIZE - 4, size=2)
        return int(y0), int(y0 + rng.integers(4, SIZE - y0 + 1)), int(x0), int(x0 + rng.integers(4, SIZE - x0 + 1))

    items = []
    for _ in range(n_items):
        gts = [rect() for _ in range(rng.choice([0, 0, 1, 2, 3]))]
        preds = []
        for y0, y1, x0, x1 in gts:
            for _ in range(rng.choice([0, 1, 1, 1, 2])):
                dy, dx = rng.choice([-2, -1, 0, 0, 0, 1, 2], size=2)
                preds.append((max(y0 + dy, 0), y1 + dy, max(x0 + dx, 0), x1 + dx))
        preds += [rect() for _ in range(rng.choice([0, 0, 0, 1, 2]))]
        if rng.random() < 0.1:
            preds.append((0, 0, 0, 0))
        scores = [float(rng.choice([0.5, 0.4999, rng.uniform(0.2, 1.0), rng.uniform(0.5, 1.0)])) for _ in preds]
        items.append(
            PhraseItem(
                gt_masks=[rle(*g) for g in gts],
                pred_masks=[rle(*p) for p in preds],
                pred_scores=scores,
                gt_crowd=[bool(rng.random() < 0.15) for _ in gts],
            )
        )
    return items


# Hand-made cases join the random ones: HUNGARIAN is the one that tells the reference's matching from a
# greedy one, and the 0.5 scores of the random cases the one that tells >= from >.
HAND_CASES = {"perfect": PERFECT, "split": SPLIT, "hungarian": HUNGARIAN}
CASES = [(seed, 0.5) for seed in range(6)] + [(6, 0.3), (9, 0.7)] + [(name, 0.5) for name in HAND_CASES]


def case_items(name: int | str) -> list[PhraseItem]:
    return HAND_CASES[name] if isinstance(name, str) else random_items(name)


def reference_module():
    try:
        path = importlib.metadata.distribution("sam3").locate_file("sam3/eval/cgf1_eval.py")
    except importlib.metadata.PackageNotFoundError:
        path = None
    assert path is not None and path.is_file(), "sam3==0.1.4 (the test extra) must be installed: it is the reference"
    spec = importlib.util.spec_from_file_location("_sam3_cgf1_eval_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_reference(module, items: list[PhraseItem], threshold: float, folder) -> dict:
    """The reference's own entry point, CGF1Evaluator, on COCO files written from the items."""
    images, annotations, predictions = [], [], []
    for image_id, item in enumerate(items, start=1):
        images.append({"id": image_id, "height": SIZE, "width": SIZE, "is_instance_exhaustive": True})
        for mask, crowd in zip(item.gt_masks, item.gt_crowd or [False] * len(item.gt_masks)):
            annotation = {"id": len(annotations) + 1, "image_id": image_id, "category_id": 1, "segmentation": mask}
            annotations.append(annotation | {"iscrowd": int(crowd), "area": float(mask_utils.area(mask))})
        for mask, score in zip(item.pred_masks, item.pred_scores):
            predictions.append({"image_id": image_id, "category_id": 1, "segmentation": mask, "score": score})
    gt_path, pred_path = folder / "gt.json", folder / "pred.json"
    gt_path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": [{"id": 1}]}))
    pred_path.write_text(json.dumps(predictions))
    evaluator = module.CGF1Evaluator(str(gt_path))
    evaluator.coco_evals[0].threshold = threshold  # the wrapper leaves CGF1Eval's default, 0.5
    with np.errstate(divide="ignore", invalid="ignore"):  # its positive_macro_F1 divides 0/0 on some cases
        out = evaluator.evaluate(str(pred_path))
    counts = evaluator.coco_evals[0].eval
    return {
        "cgf1": 100 * out["cgF1_eval_segm_cgF1"],
        "pmf1": out["cgF1_eval_segm_positive_micro_F1"],
        "il_mcc": out["cgF1_eval_segm_IL_MCC"],
        "tp": tuple(int(v) for v in counts["TPs"]),
        "fp": tuple(int(v) for v in counts["positive_micro_FPs"]),
        "fn": tuple(int(v) for v in counts["FNs"]),
    }


@pytest.fixture(scope="module")
def reference_results(tmp_path_factory):
    module = reference_module()
    results = {}
    for seed, threshold in CASES:
        folder = tmp_path_factory.mktemp(f"cgf1_ref_{seed}")
        results[seed, threshold] = run_reference(module, case_items(seed), threshold, folder)
    return results


def ours(seed: int, threshold: float) -> dict:
    result = compute_cgf1(case_items(seed), threshold=threshold).as_dict()
    return {key: result[key] for key in ("cgf1", "pmf1", "il_mcc", "tp", "fp", "fn")}


def matches(mine: dict, ref: dict) -> bool:
    return all(
        mine[k] == ref[k] if isinstance(ref[k], tuple) else mine[k] == pytest.approx(ref[k], rel=1e-12, abs=1e-12)
        for k in ref
    )


@pytest.mark.parametrize(("seed", "threshold"), CASES)
def test_equals_the_reference(reference_results, seed, threshold):
    ref = reference_results[seed, threshold]
    mine = ours(seed, threshold)
    assert matches(mine, ref), f"ours {mine}\nreference {ref}"


def test_random_cases_are_not_degenerate(reference_results):
    # The equality above means something only if the cases differ, reach an undefined MCC and a partial one,
    # and have matches whose IoU falls between the thresholds.
    refs = [reference_results[seed, threshold] for seed, threshold in CASES if isinstance(seed, int)]
    assert len({ref["cgf1"] for ref in refs}) >= len(refs) - 2
    assert any(ref["il_mcc"] == 0 for ref in refs) and any(0.3 < ref["il_mcc"] < 0.9 for ref in refs)
    assert all(len(set(ref["tp"])) >= 2 for ref in refs)


# --- (c) planted defects: each wrong rule must change some number the equality test checks


def greedy_match(ious: np.ndarray) -> np.ndarray:
    """Highest IoU first, one to one: the matching a hand-rolled evaluator would likely write."""
    taken_rows, taken_cols, matched = set(), set(), []
    for flat in np.argsort(-ious, axis=None, kind="stable"):
        row, col = np.unravel_index(flat, ious.shape)
        if row not in taken_rows and col not in taken_cols:
            taken_rows.add(row)
            taken_cols.add(col)
            matched.append(ious[row, col])
    return np.asarray(matched, dtype=np.float64)


DEFECTS = {
    "iou_above_0.3": ("IOU_THRESHOLDS", np.full(10, 0.3)),
    "iou_0.5_only": ("IOU_THRESHOLDS", np.array([0.5])),
    "score_strictly_above": ("_keep_prediction", lambda score, threshold: score > threshold),
    "below_threshold_counted": ("_keep_prediction", lambda score, threshold: True),
    "greedy_matching": ("_match", greedy_match),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_planted_defect_is_caught(reference_results, monkeypatch, defect):
    name, value = DEFECTS[defect]
    monkeypatch.setattr(cgf1_mod, name, value)
    caught = [case for case in CASES if not matches(ours(*case), reference_results[case])]
    assert caught, f"planted defect {defect!r} gives the reference's numbers on every case"
