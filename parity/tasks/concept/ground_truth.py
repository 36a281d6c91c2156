"""The concept task against the data set's ground truth: each (image, phrase)'s annotated instances of the
category the phrase names, and the detections' cgF1 over every pair (parity.compare.cgf1, sam3's metric)."""

from __future__ import annotations

from parity.compare import cgf1
from parity.golden.data import Dataset
from parity.golden.rle import encode_rle


def concept_f1(dataset: Dataset, images: dict[int, list[dict]], threshold: float) -> cgf1.CgF1Result:
    """cgF1 of the detections `images` holds (image id -> pairs, as parity.tasks.concept.produce makes them)
    against `dataset`'s instances, at the confidence threshold the detections were kept at."""
    category_of = {name: category_id for category_id, name in dataset.categories.items()}
    items = []
    for sample in dataset.samples:
        for pair in images[sample.image_id]:
            truth = [encode_rle(a.mask) for a in sample.annotations if a.category_id == category_of[pair["phrase"]]]
            items.append(cgf1.PhraseItem(truth, [d["segmentation"] for d in pair["detections"]],
                                          [d["score"] for d in pair["detections"]]))
    return cgf1.compute_cgf1(items, threshold=threshold)
