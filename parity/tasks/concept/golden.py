"""Concept goldens: per (image, phrase) the fp32 model's presence and its detections above the confidence
threshold (query, score, box, COCO RLE mask), in the golden store.

A golden folder (named like the point goldens, with a `concept` marker) holds manifest.json and
detections.json.gz: {"images": [{"image_id", "file_name", "height", "width", "pairs": [pair, ...]}]}, a pair
as parity.tasks.concept.produce.plain_pair makes it (its phrase, presence, every query's score, and the
detections above the threshold), reproducible to the byte (parity.golden.image_entries).
"""

from __future__ import annotations

import math
from pathlib import Path

from parity.golden import image_entries
from parity.golden import manifest as golden_io
from parity.golden import store
from parity.golden.data import Dataset
from parity.tasks.concept.produce import DETECTION_KEYS, PAIR_KEYS, Detected

MARKER = "concept"
DETECTIONS_FILE = "detections.json.gz"
FORMAT_VERSION = 1
# What prompts the model: every category name of the data set as a phrase, on every image.
PHRASE_POLICY = "concept-category-names-v1"


def folder_name(model_type: str, checkpoint_id: str, dataset: Dataset) -> str:
    return golden_io.golden_dir_name(model_type, checkpoint_id, dataset.name, dataset.limit, MARKER)


def encode(detected: Detected) -> bytes:
    return image_entries.encode(detected.images, detected.described, "pairs")


def _pair_problem(pair) -> str | None:
    if not isinstance(pair, dict) or set(pair) != set(PAIR_KEYS):
        return f"a pair without exactly the keys {sorted(PAIR_KEYS)}"
    if any(not isinstance(d, dict) or set(d) != set(DETECTION_KEYS) for d in pair["detections"]):
        return f"a detection without exactly the keys {sorted(DETECTION_KEYS)}"
    return None


def decode(data: bytes, path: Path, regenerate: str) -> dict[int, list[dict]]:
    """image id -> pairs, refusing anything that is not the shape encode() writes."""
    return image_entries.decode(data, path, regenerate, "pairs", _pair_problem)


def refuse_useless(images: dict[int, list[dict]], fix: str) -> None:
    """A golden without a detection (a threshold above every score) or with a non-finite score could only make
    a check that cannot fail on masks."""
    pairs = [pair for entry in images.values() for pair in entry]
    if not any(pair["detections"] for pair in pairs):
        raise golden_io.UselessGolden(f"no detection scored above the confidence threshold on any of the {len(pairs)} "
                                      f"(image, phrase) pairs, so a concept golden would gate no mask. {fix}")
    for image_id, entry in images.items():
        for pair in entry:
            values = [pair["presence"], *pair["query_scores"]]
            if not all(math.isfinite(v) for v in values):
                raise golden_io.UselessGolden(f"image {image_id}, phrase {pair['phrase']!r}: a non-finite score; the fp32 "
                                              "model is broken, no golden written")


def publish(folder: Path, detected: Detected, manifest: dict) -> Path:
    pairs = [pair for entry in detected.images.values() for pair in entry]
    manifest = {**manifest, "task": MARKER, "format_version": FORMAT_VERSION, "prompt_policy": PHRASE_POLICY,
                "images": len(detected.images), "pairs": len(pairs),
                "detections": sum(len(pair["detections"]) for pair in pairs)}
    return store.publish(folder, {DETECTIONS_FILE: encode(detected)}, manifest)


def read(folder: Path, regenerate: str) -> tuple[dict, dict[int, list[dict]]]:
    folder = Path(folder)
    manifest, files = store.read(folder, regenerate)
    if manifest.get("task") != MARKER or manifest.get("format_version") != FORMAT_VERSION:
        raise golden_io.GoldenMismatch(
            f"golden {folder} is not a concept golden of format {FORMAT_VERSION} (task={manifest.get('task')!r}, "
            f"format_version={manifest.get('format_version')!r}). Regenerate it with:\n  {regenerate}")
    return manifest, decode(files[DETECTIONS_FILE], folder / DETECTIONS_FILE, regenerate)


def verify_params(manifest: dict, confidence_threshold: float, phrases: list[str], folder: Path,
                  regenerate: str) -> None:
    """Refuse a golden made at another threshold or with other phrases: it answers another question."""
    recorded = {"confidence_threshold": manifest.get("confidence_threshold"), "phrases": manifest.get("phrases")}
    asked = {"confidence_threshold": confidence_threshold, "phrases": phrases}
    differ = [f"{k}: golden {recorded[k]!r}, this run {asked[k]!r}" for k in asked if recorded[k] != asked[k]]
    if differ:
        raise golden_io.GoldenMismatch(
            f"golden {folder} was made with other parameters ({'; '.join(differ)}). Comparing them would measure "
            f"the parameters, not the model. Regenerate the golden with:\n  {regenerate}")
