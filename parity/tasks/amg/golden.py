"""AMG goldens: per image the fp32 generator's masks as COCO RLE with their scores, in the golden store.

A golden folder (named like the point goldens, with an `amg` marker) holds manifest.json and
masks.json.gz: {"images": [{"image_id", "file_name", "height", "width", "masks": [record, ...]}]}
with the generator's records (parity.tasks.amg.produce.RECORD_KEYS), reproducible to the byte
(parity.golden.image_entries).
"""

from __future__ import annotations

import math
from pathlib import Path

from parity.golden import image_entries
from parity.golden import manifest as golden_io
from parity.golden import store
from parity.golden.data import Dataset
from parity.tasks.amg.produce import RECORD_KEYS, AmgParams, Generated

MARKER = "amg"
MASKS_FILE = "masks.json.gz"
FORMAT_VERSION = 1
# What prompts the masks: the generator's point grid, set by the parameters recorded beside it.
GRID_POLICY = "amg-point-grid-v1"


def folder_name(model_type: str, checkpoint_id: str, dataset: Dataset) -> str:
    return golden_io.golden_dir_name(model_type, checkpoint_id, dataset.name, dataset.limit, MARKER)


def encode(generated: Generated) -> bytes:
    """masks.json.gz bytes for the generated records of every image."""
    return image_entries.encode(generated.images, generated.described, "masks")


def _record_problem(record) -> str | None:
    if not isinstance(record, dict) or set(record) != set(RECORD_KEYS):
        return f"a mask record without exactly the keys {sorted(RECORD_KEYS)}"
    return None


def decode(data: bytes, path: Path, regenerate: str) -> dict[int, list[dict]]:
    """image id -> records, refusing anything that is not the shape encode() writes."""
    return image_entries.decode(data, path, regenerate, "masks", _record_problem)


def refuse_useless(images: dict[int, list[dict]], fix: str) -> None:
    """A golden with no mask at all (e.g. seeded weights, which the default thresholds filter out
    entirely) or with a non-finite score could only make a check that cannot fail."""
    if not any(images.values()):
        raise golden_io.UselessGolden(f"the generator found no mask on any of the {len(images)} images, so an AMG golden would "
                         f"gate nothing. Use weights that segment (e.g. --checkpoint trained) or {fix}")
    for image_id, records in images.items():
        for record in records:
            if not all(math.isfinite(record[k]) for k in ("predicted_iou", "stability_score")):
                raise golden_io.UselessGolden(f"image {image_id}: a mask has a non-finite score ({record['predicted_iou']}, "
                                 f"{record['stability_score']}); the fp32 model is broken, no golden written")


def publish(folder: Path, generated: Generated, manifest: dict) -> Path:
    manifest = {**manifest, "task": MARKER, "format_version": FORMAT_VERSION, "prompt_policy": GRID_POLICY,
                "images": len(generated.images), "masks": sum(len(r) for r in generated.images.values())}
    return store.publish(folder, {MASKS_FILE: encode(generated)}, manifest)


def read(folder: Path, regenerate: str) -> tuple[dict, dict[int, list[dict]]]:
    folder = Path(folder)
    manifest, files = store.read(folder, regenerate)
    if manifest.get("task") != MARKER or manifest.get("format_version") != FORMAT_VERSION:
        raise golden_io.GoldenMismatch(
            f"golden {folder} is not an AMG golden of format {FORMAT_VERSION} (task={manifest.get('task')!r}, "
            f"format_version={manifest.get('format_version')!r}). Regenerate it with:\n  {regenerate}")
    return manifest, decode(files[MASKS_FILE], folder / MASKS_FILE, regenerate)


def verify_params(manifest: dict, params: AmgParams, folder: Path, regenerate: str) -> None:
    """Refuse a golden made with other generator parameters: its masks answer another question."""
    recorded = manifest.get("amg_params", {})
    differ = {k: (recorded.get(k), v) for k, v in params.as_dict().items() if recorded.get(k) != v}
    if differ:
        listed = ", ".join(f"{k}: golden {g!r}, this run {r!r}" for k, (g, r) in differ.items())
        raise golden_io.GoldenMismatch(
            f"golden {folder} was made with other generator parameters ({listed}). Comparing them would "
            f"measure the parameters, not the model. Regenerate the golden with:\n  {regenerate}")
