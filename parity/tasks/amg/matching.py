"""One-to-one matching of a stage's generated masks to the golden's, and the figures built on it.

Per image, the masks are paired by a linear assignment that maximizes the summed mask IoU over
pairs above MATCH_IOU (scipy.optimize.linear_sum_assignment); a golden mask left without a pair
is *lost*, a stage mask left without one is *new*. Matching looks at masks only, never at scores
or order, so a stage that reorders its output is not penalized and one that permutes scores is
caught by the score error of matched pairs instead.

The headline figure is the mean IoU over the *union* of both sets: every matched pair counts
once with its IoU, every lost or new mask counts with IoU 0 - but one *near a decision*: a mask that
one side kept and the other did not, which on the side that kept it sat within the stage's tolerance
of one of the generator's decisions (DecisionBand): its predicted IoU just above pred_iou_thresh, its
stability just above stability_score_thresh, its box's IoU with a mask of its crop that outscores it
(or nearly) just below box_nms_thresh, its box's IoU with a mask of a crop no larger just below
crop_nms_thresh, a box edge about CROP_EDGE_PIXELS from a crop border, and with min_mask_region_area a
hole or island of about that area or a box just below the NMS threshold after that clean-up. A lost
(new) mask whose box a mask near a decision on the other side overlaps above box_nms_thresh, less the
box tolerance, and outscores or nearly, may have been dropped there by that mask: near too. Rounding
alone may take such a mask across the decision, so it is counted (lost_near_decision,
new_near_decision), not failed, as the point task counts a best-mask flip between near-tied scores; a
stage that moves the scores further is failed by the score error of its matched pairs.
Where NMS itself decided between two masks of near-tied scores, rounding may swap which one is kept:
given the masks the stage's NMS dropped at such a tie (its *alternates*, parity.tasks.amg.alternates),
a golden mask that one of them fits better than the stage's kept masks is paired with it (*swapped at
NMS*, its IoU and score error counted as any pair's), and the stage mask kept in its place is counted
near a decision. A mean over matched pairs alone (as
torchao's AMG parity script reports, after dropping every image whose mask count changed) cannot
see a lost mask at all and cannot see a split beyond the larger half; the union mean sees both,
and no image is ever left out of it. The matched mean is reported beside it, because it says how
close the masks that do correspond are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pycocotools import mask as mask_utils
from scipy import ndimage
from scipy.optimize import linear_sum_assignment

from parity.compare.metrics import box_iou

# Above 0.5 a pair is unambiguous: two disjoint masks cannot both overlap a third by more than half
# of their union, so a mask split in two matches its larger half only. Pairs at or below it are unmatched.
MATCH_IOU = 0.5
WORST_IMAGES = 5


# What the generator's crop-edge filter (samfast.amg.masks.near_crop_edge) drops: a box within this many
# pixels of a crop border that is not the image's.
CROP_EDGE_PIXELS = 20.0
# samfast.amg.small_regions' connectivity (that module imports the model stack, which matching must not)
EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


@dataclass(frozen=True)
class DecisionBand:
    """The generator's decisions (its parameters: score filters, box NMS, crop NMS, crop-edge filter,
    min_mask_region_area's clean-up and the NMS after it) and how far a stage may move what each decides on:
    a predicted IoU (score_tolerance: its max_score_abs_err), a stability score (stability_tolerance: its
    max_stability_shift) and a box (box_iou_tolerance: its max_box_iou_shift, the box IoU between two masks;
    an edge of a box of side n moves by up to n times it, a region's area by ((1 + it) ** 2 - 1) times it)."""

    pred_iou_thresh: float
    stability_score_thresh: float
    box_nms_thresh: float
    score_tolerance: float
    stability_tolerance: float
    box_iou_tolerance: float
    crop_nms_thresh: float = 0.7
    min_mask_region_area: int = 0

    @classmethod
    def of(cls, params, limits) -> DecisionBand:
        """The band of a generator's parameters (parity.tasks.amg.generate.AmgParams) at a stage's limits."""
        return cls(params.pred_iou_thresh, params.stability_score_thresh, params.box_nms_thresh,
                   limits["max_score_abs_err"], limits["max_stability_shift"], limits["max_box_iou_shift"],
                   params.crop_nms_thresh, params.min_mask_region_area)

    def holds(self, index: int, kept: Sequence[dict]) -> bool:
        """Whether kept[index] (one side's records of an image) sat near one of the generator's decisions on that side."""
        return (self._near_a_filter(kept[index]) or self._near_nms(index, kept) or self._near_crop_nms(index, kept)
                or self._near_crop_edge(kept[index]) or self._near_region_cleanup(index, kept))

    def _near_a_filter(self, record: dict) -> bool:
        # the generator keeps predicted_iou > pred_iou_thresh and stability_score >= stability_score_thresh
        return (self.pred_iou_thresh < float(record["predicted_iou"]) <= self.pred_iou_thresh + self.score_tolerance
                or self.stability_score_thresh <= float(record["stability_score"])
                <= self.stability_score_thresh + self.stability_tolerance)

    def _below(self, thresh: float, a: dict, b: dict) -> bool:
        return thresh - self.box_iou_tolerance < box_iou(a["bbox"], b["bbox"]) <= thresh

    def _near_nms(self, index: int, kept: Sequence[dict]) -> bool:
        # NMS (within a crop) drops the lower-scored of two boxes above box_nms_thresh: a mask kept with a box
        # IoU just below it, beside a mask of its crop that outscores it or nearly (the order may flip too), is
        # one box shift of rounding from being dropped
        record = kept[index]
        score = float(record["predicted_iou"]) - self.score_tolerance
        return any(self._below(self.box_nms_thresh, record, other)
                   for i, other in enumerate(kept) if i != index and other.get("crop_box") == record.get("crop_box")
                   and float(other["predicted_iou"]) >= score)

    def _near_crop_nms(self, index: int, kept: Sequence[dict]) -> bool:
        # NMS between crops drops the mask of the larger crop (1 / crop area is its score; equal areas tie)
        record = kept[index]
        area = _crop_area(record)
        return any(self._below(self.crop_nms_thresh, record, other) for i, other in enumerate(kept)
                   if i != index and other.get("crop_box") != record.get("crop_box") and _crop_area(other) <= area)

    def _near_crop_edge(self, record: dict) -> bool:
        # the generator drops a box with an edge within CROP_EDGE_PIXELS of a crop border that is not the image's:
        # an edge that far from one, give or take how far the stage may move it, sits on that decision
        if "crop_box" not in record:
            return False
        height, width = record["segmentation"]["size"]
        x, y, w, h = record["bbox"]
        cx, cy, cw, ch = record["crop_box"]
        edges = ((x, cx, 0, w), (y, cy, 0, h), (x + w, cx + cw, width, w), (y + h, cy + ch, height, h))
        return any(border != image_border and abs(abs(coord - border) - CROP_EDGE_PIXELS) <= self.box_iou_tolerance * side
                   for coord, border, image_border, side in edges)

    def _near_region_cleanup(self, index: int, kept: Sequence[dict]) -> bool:
        # min_mask_region_area fills holes and removes islands smaller than it (SAM 1's generator), then NMS
        # at the larger NMS threshold prefers the masks it left unchanged: a mask with a region of little more
        # than that area may have been changed on the other side, and a box just below that NMS threshold
        # beside any mask (the preference is not a score) may have been dropped there
        if self.min_mask_region_area <= 0:
            return False
        thresh = max(self.box_nms_thresh, self.crop_nms_thresh)
        if any(self._below(thresh, kept[index], other) for i, other in enumerate(kept) if i != index):
            return True
        area = self.min_mask_region_area
        upper = area * (1.0 + self.box_iou_tolerance) ** 2
        mask = mask_utils.decode(kept[index]["segmentation"]).astype(bool)
        return any(area <= size <= upper for size in _region_sizes(mask))

    def kept_in_place_of(self, record: dict, alternate: dict) -> bool:
        """Whether NMS may have kept `record` over `alternate` at a near tie (parity.tasks.amg.alternates): their
        boxes overlap above box_nms_thresh and their scores lie within the score tolerance."""
        return (box_iou(record["bbox"], alternate["bbox"]) > self.box_nms_thresh
                and abs(float(record["predicted_iou"]) - float(alternate["predicted_iou"])) <= self.score_tolerance)

    def suppressed_by(self, record: dict, other: dict) -> bool:
        """Whether `other` (the other side's mask) may have had box NMS drop `record` there: their boxes overlap
        above box_nms_thresh less the box tolerance and `other` scores at least `record`'s less the score tolerance."""
        return (box_iou(record["bbox"], other["bbox"]) > self.box_nms_thresh - self.box_iou_tolerance
                and float(other["predicted_iou"]) >= float(record["predicted_iou"]) - self.score_tolerance)


def _crop_area(record: dict) -> float:
    crop = record.get("crop_box")
    return float(crop[2] * crop[3]) if crop else 0.0


def _region_sizes(mask: np.ndarray) -> list[int]:
    """Pixel counts of the mask's 8-connected holes and islands (samfast.amg.small_regions' regions)."""
    sizes = []
    for regions in (mask, ~mask):
        labels, n = ndimage.label(regions, structure=EIGHT_CONNECTED)
        sizes += np.bincount(labels.ravel(), minlength=n + 1)[1:].tolist()
    return sizes


@dataclass(frozen=True)
class Pair:
    golden: int  # index into the golden's masks of the image
    stage: int  # index into the stage's masks of the image (into its alternates when swapped)
    iou: float
    predicted_iou_err: float  # |stage predicted_iou - golden predicted_iou|
    stability_err: float  # |stage stability_score - golden stability_score|
    swapped: bool = False  # paired with a mask the stage's NMS dropped at a near tie
    # Both masks answer the same prompt (point and crop), so their scores are one prediction made twice.
    # Across prompts (an NMS near tie that kept another point's mask) the scores are two predictions: their
    # difference is no error of the stage, and the score gates leave it out.
    same_prompt: bool = True


@dataclass(frozen=True)
class ImageMatch:
    image_id: int
    golden_count: int
    stage_count: int
    pairs: tuple[Pair, ...]
    lost_near_decision: int = 0  # lost masks that sat near a decision on the golden's side (DecisionBand)
    new_near_decision: int = 0  # new masks that sat near one on the stage's side, or were kept in a swap's place

    @property
    def lost(self) -> int:
        return self.golden_count - len(self.pairs)

    @property
    def new(self) -> int:
        return self.stage_count - sum(not p.swapped for p in self.pairs)

    @property
    def swapped(self) -> int:
        return sum(p.swapped for p in self.pairs)

    @property
    def union(self) -> int:
        """The masks the union mean counts: every one but those near a decision."""
        return len(self.pairs) + self.lost - self.lost_near_decision + self.new - self.new_near_decision

    @property
    def union_iou_mean(self) -> float:
        # Both sides found nothing: they agree (as parity.compare.metrics.mask_iou says of two empty masks).
        return sum(p.iou for p in self.pairs) / self.union if self.union else 1.0


def _rles(records: Sequence[dict], image_id: int, side: str) -> list[dict]:
    rles = []
    for i, record in enumerate(records):
        segmentation = record["segmentation"]
        if not (isinstance(segmentation, dict) and "counts" in segmentation):
            raise TypeError(f"image {image_id}: {side} mask {i} is not COCO RLE; run the generator with output_mode='coco_rle'")
        rles.append(segmentation)
    return rles


PROMPT_KEYS = ("point_coords", "crop_box")  # what the generator prompted a mask with; absent in hand-made records


def same_prompt(a: dict, b: dict) -> bool:
    # a grid point's coordinates to within a thousandth of a pixel: the golden may store them rounded
    return all(np.shape(a[key]) == np.shape(b[key]) and np.allclose(a[key], b[key], rtol=0, atol=1e-3)
               for key in PROMPT_KEYS if key in a and key in b)


def _pair(g: int, s: int, iou: float, golden: Sequence[dict], stage: Sequence[dict], swapped: bool = False) -> Pair:
    return Pair(golden=g, stage=s, iou=iou, swapped=swapped, same_prompt=same_prompt(stage[s], golden[g]),
                predicted_iou_err=abs(float(stage[s]["predicted_iou"]) - float(golden[g]["predicted_iou"])),
                stability_err=abs(float(stage[s]["stability_score"]) - float(golden[g]["stability_score"])))


def _mask_ious(rles: list[dict], golden_rles: list[dict]) -> np.ndarray:
    """iou[s, g]; crowd flags off: plain intersection over union."""
    return np.asarray(mask_utils.iou(rles, golden_rles, [0] * len(golden_rles)), dtype=np.float64)


def match_image(image_id: int, golden: Sequence[dict], stage: Sequence[dict], band: DecisionBand | None = None,
                alternates: Sequence[dict] = ()) -> ImageMatch:
    """Match one image's stage records to its golden records (generator records, COCO RLE masks); with a
    band, count the unmatched masks near a decision, and pair golden masks with the stage's alternates
    where those fit better (swapped at NMS)."""
    golden_rles, stage_rles = _rles(golden, image_id, "golden"), _rles(stage, image_id, "stage")
    sizes = {tuple(r["size"]) for r in golden_rles + stage_rles}
    if len(sizes) > 1:
        raise ValueError(f"image {image_id}: masks of different sizes {sorted(sizes)}; golden and stage ran on other images")
    pairs = {}  # golden index -> Pair
    if golden_rles and stage_rles:
        iou = _mask_ious(stage_rles, golden_rles)
        eligible = np.where(iou > MATCH_IOU, iou, 0.0)
        for s, g in zip(*linear_sum_assignment(eligible, maximize=True)):
            if eligible[s, g] > 0.0:
                pairs[int(g)] = _pair(int(g), int(s), float(iou[s, g]), golden, stage)
    swapped_in = _swap_at_nms(golden, golden_rles, alternates, pairs, image_id) if band and alternates and golden_rles else []
    paired_stage = {p.stage for p in pairs.values() if not p.swapped}
    lost = [g for g in range(len(golden)) if g not in pairs]
    new = [s for s in range(len(stage)) if s not in paired_stage]
    lost_near, new_near = set(), set()
    if band:
        lost_near = {g for g in lost if band.holds(g, golden)}
        # near a decision, or kept in place of a swapped-in alternate
        new_near = {s for s in new if band.holds(s, stage) or any(band.kept_in_place_of(stage[s], a) for a in swapped_in)}
        _near_through_nms(band, golden, stage, lost, new, lost_near, new_near)
    return ImageMatch(image_id, len(golden_rles), len(stage_rles), tuple(pairs[g] for g in sorted(pairs)),
                      lost_near_decision=len(lost_near), new_near_decision=len(new_near))


def _near_through_nms(band: DecisionBand, golden: Sequence[dict], stage: Sequence[dict], lost: list[int],
                      new: list[int], lost_near: set[int], new_near: set[int]) -> None:
    """Add to lost_near (new_near) the lost (new) masks that a mask near a decision on the other side may have
    dropped there by box NMS (DecisionBand.suppressed_by): their fate hinged on that mask's, until none is added."""
    while True:
        more_lost = {g for g in lost if g not in lost_near and any(band.suppressed_by(golden[g], stage[s]) for s in new_near)}
        more_new = {s for s in new if s not in new_near and any(band.suppressed_by(stage[s], golden[g]) for g in lost_near)}
        if not (more_lost or more_new):
            return
        lost_near |= more_lost
        new_near |= more_new


def _swap_at_nms(golden: Sequence[dict], golden_rles: list[dict], alternates: Sequence[dict], pairs: dict[int, Pair],
                 image_id: int) -> list[dict]:
    """Pair each golden mask, lost or matched, with the stage's alternate that fits it better than its pair
    (each alternate once, golden masks in order), in `pairs`; returns the alternates so swapped in."""
    iou = _mask_ious(_rles(alternates, image_id, "alternate"), golden_rles)
    used = []
    for g in range(len(golden)):
        floor = pairs[g].iou if g in pairs else MATCH_IOU
        fits = [a for a in range(len(alternates)) if a not in used and iou[a, g] > floor]
        if fits:
            a = max(fits, key=lambda a: iou[a, g])
            used.append(a)
            pairs[g] = _pair(g, a, float(iou[a, g]), golden, alternates, swapped=True)
    return [alternates[a] for a in used]


@dataclass(frozen=True)
class MatchSummary:
    """A stage's figures over all images; no image is left out of any of them."""

    images: int
    golden_masks: int
    stage_masks: int
    matched: int
    lost: int
    new: int
    lost_near_decision: int  # of the lost, those near a decision on the golden's side: not in the union mean
    new_near_decision: int  # of the new, those near one on the stage's side or kept in a swap's place
    swapped: int  # of the matched, those paired with a mask the stage's NMS dropped at a near tie
    other_prompt: int  # of the matched, those whose masks answer different prompts: matched, not scored
    count_changed_images: int  # images whose number of masks differs from the golden's
    union_iou_mean: float  # matched IoUs over matched + lost + new but those near a decision (unmatched count as 0)
    matched_iou_mean: float  # over matched pairs only; NaN when nothing matched (fails any gate)
    matched_iou_p5: float
    predicted_iou_max_err: float  # over matched pairs of the same prompt; NaN when there is none
    stability_max_err: float
    worst: list[dict]  # the WORST_IMAGES images of lowest union mean

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(matches: Sequence[ImageMatch]) -> MatchSummary:
    if not any(m.golden_count or m.stage_count for m in matches):
        # A gate that compared nothing must not pass.
        raise ValueError("neither the golden nor the stage has a single mask: there is nothing to compare")
    union = sum(m.union for m in matches)
    pairs = [p for m in matches for p in m.pairs]
    scored = [p for p in pairs if p.same_prompt]
    ious = np.array([p.iou for p in pairs], dtype=np.float64)
    nan = math.nan
    worst = sorted(matches, key=lambda m: (m.union_iou_mean, -m.union, m.image_id))[:WORST_IMAGES]
    return MatchSummary(
        images=len(matches),
        golden_masks=sum(m.golden_count for m in matches),
        stage_masks=sum(m.stage_count for m in matches),
        matched=len(pairs),
        lost=sum(m.lost for m in matches),
        new=sum(m.new for m in matches),
        lost_near_decision=sum(m.lost_near_decision for m in matches),
        new_near_decision=sum(m.new_near_decision for m in matches),
        swapped=sum(m.swapped for m in matches),
        other_prompt=len(pairs) - len(scored),
        count_changed_images=sum(m.golden_count != m.stage_count for m in matches),
        # every unmatched mask near a decision and nothing matched: NaN, which fails the gate
        union_iou_mean=float(ious.sum()) / union if union else nan,
        matched_iou_mean=float(ious.mean()) if pairs else nan,
        matched_iou_p5=float(np.percentile(ious, 5)) if pairs else nan,
        predicted_iou_max_err=max((p.predicted_iou_err for p in scored), default=nan),
        stability_max_err=max((p.stability_err for p in scored), default=nan),
        worst=[{"image_id": m.image_id, "union_iou_mean": m.union_iou_mean, "golden_masks": m.golden_count,
                "stage_masks": m.stage_count, "lost": m.lost, "new": m.new,
                "lost_near_decision": m.lost_near_decision, "new_near_decision": m.new_near_decision,
                "swapped": m.swapped,  # their pairs are not listed: their stage side is no record of the stage's
                "pairs": [[p.golden, p.stage, p.iou] for p in m.pairs if not p.swapped]} for m in worst],
    )
