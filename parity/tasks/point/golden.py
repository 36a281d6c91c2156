"""The point task's golden: what it stores and how its bytes are read back.

A point golden folder holds manifest.json (what produced it, and the sha256 of each file), predictions.json.gz
(per annotation: the three multimask masks as RLE, the predicted IoUs, the best index, IoU vs ground
truth) and logits.npz (fp16 low-res logits of a bounded subset of annotations). This module turns
StageOutputs into those files' bytes, deterministically, and back, refusing (GoldenCorrupt) anything
that is not a golden the gate can trust: the store checks the bytes, this module the records in them.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import zipfile
import zlib
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from parity.golden import store
from parity.golden.manifest import IDENTITY_FIELDS, GoldenMismatch, gzip_json, is_int, is_number, npz
from parity.tasks.point.produce import AnnotationOutput, StageOutputs

FORMAT_VERSION = 2  # 2: the manifest lists each file's sha256 (parity/golden/store.py); 1 had no checksums
PREDICTIONS, LOGITS = "predictions.json.gz", "logits.npz"
CONTENT_FILES = (PREDICTIONS, LOGITS)
RECORD_FIELDS = {f.name for f in fields(AnnotationOutput)}
DEFAULT_REGENERATE = "python -m parity golden ... (the golden's model, checkpoint and data; or `nox -s golden`)"


def encode_golden(outputs: StageOutputs) -> dict[str, bytes]:
    """The golden's content files as bytes, deterministically."""
    ann_ids = np.array(list(outputs.logits), dtype=np.int64)
    # an empty table is written only by tests of the reader (make_golden refuses such outputs first)
    stacked = np.stack([outputs.logits[i] for i in ann_ids]).astype(np.float16) if len(ann_ids) else np.zeros((0, 3, 256, 256), np.float16)
    return {
        PREDICTIONS: gzip_json([asdict(a) for a in outputs.annotations]),
        LOGITS: npz({"ann_ids": ann_ids, "logits": stacked}),
    }


def write_golden(folder: Path, outputs: StageOutputs, manifest: dict) -> Path:
    """Publish through the store: swapped in whole, never half (parity/store.py says why)."""
    manifest = {**manifest, "format_version": FORMAT_VERSION, "annotations": len(outputs.annotations)}
    return store.publish(folder, encode_golden(outputs), manifest)


def read_golden(folder: Path, regenerate: str = DEFAULT_REGENERATE) -> tuple[dict, StageOutputs]:
    """The golden's manifest and outputs, every byte verified and every record checked (GoldenCorrupt if not)."""
    folder = Path(folder)
    manifest, files = store.read(folder, regenerate)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GoldenMismatch(f"golden {folder} has format {manifest.get('format_version')}, this parity reads "
                             f"{FORMAT_VERSION}. Regenerate it with:\n  {regenerate}")
    missing = sorted(({*IDENTITY_FIELDS, "annotations"} - set(manifest)) | (set(CONTENT_FILES) - set(manifest["files"])))
    if missing:
        raise store.corrupt(folder, store.MANIFEST, f"lacks {', '.join(missing)}", regenerate)
    records = _decode_predictions(folder, files[PREDICTIONS], manifest["annotations"], regenerate)
    logits = _decode_logits(folder, files[LOGITS], {r.ann_id for r in records}, regenerate)
    return manifest, StageOutputs(records, logits, 0, 0.0, 0, 0.0)


def _record_problem(record) -> str | None:
    """What is wrong with one predictions record, or None."""
    if not isinstance(record, dict) or set(record) != RECORD_FIELDS:
        return f"has keys {sorted(record) if isinstance(record, dict) else type(record).__name__}, not {sorted(RECORD_FIELDS)}"
    if not all(is_int(record[k]) for k in ("ann_id", "image_id", "category_id", "best")):
        return "has a non-integer id or best index"
    scores, rles = record["scores"], record["rles"]
    if not (isinstance(scores, list) and len(scores) == 3 and all(is_number(x) for x in scores)):
        return "does not hold three finite scores"
    if record["best"] not in (0, 1, 2) or not is_number(record["gt_iou"]):
        return "has a best index outside 0..2 or a non-finite gt_iou"
    if not (isinstance(rles, list) and len(rles) == 3 and all(
            isinstance(r, dict) and isinstance(r.get("counts"), str) and isinstance(r.get("size"), list) for r in rles)):
        return "does not hold three RLE masks"
    return None


def _decode_predictions(folder: Path, data: bytes, count, regenerate: str) -> list[AnnotationOutput]:
    try:
        records = json.loads(gzip.decompress(data))
    except (OSError, EOFError, zlib.error, ValueError) as err:
        raise store.corrupt(folder, PREDICTIONS, f"cannot be read as gzipped JSON ({err})", regenerate) from None
    if not isinstance(records, list) or not records:
        raise store.corrupt(folder, PREDICTIONS, "holds no list of annotation records", regenerate)
    if not is_int(count) or len(records) != count:
        raise store.corrupt(folder, PREDICTIONS, f"holds {len(records)} records, the manifest says {count!r} annotations", regenerate)
    seen = set()
    for index, record in enumerate(records):
        problem = _record_problem(record)
        if problem:
            raise store.corrupt(folder, PREDICTIONS, f"record {index} {problem}", regenerate)
        if record["ann_id"] in seen:
            raise store.corrupt(folder, PREDICTIONS, f"holds annotation id {record['ann_id']} twice", regenerate)
        seen.add(record["ann_id"])
    return [AnnotationOutput(**r) for r in records]


def _decode_logits(folder: Path, data: bytes, record_ids: set[int], regenerate: str) -> dict[int, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            ann_ids, logits = npz["ann_ids"], npz["logits"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error, lzma.LZMAError) as err:
        raise store.corrupt(folder, LOGITS, f"cannot be read as an npz of ann_ids and logits ({err})", regenerate) from None
    if ann_ids.ndim != 1 or ann_ids.dtype.kind not in "iu" or logits.ndim != 4 or logits.shape[:2] != (len(ann_ids), 3):
        raise store.corrupt(folder, LOGITS, f"has ann_ids {ann_ids.shape} and logits {logits.shape}, not (N,) and (N, 3, H, W)", regenerate)
    if not len(ann_ids):
        raise store.corrupt(folder, LOGITS, "has no rows: the logits gate would check nothing", regenerate)
    strangers = sorted(set(ann_ids.tolist()) - record_ids)
    if strangers or len(set(ann_ids.tolist())) != len(ann_ids):
        raise store.corrupt(folder, LOGITS, f"has ids matching no record or repeated ({strangers[:5] or 'repeated'})", regenerate)
    if not np.isfinite(logits).all():
        raise store.corrupt(folder, LOGITS, "holds non-finite logits", regenerate)
    return {int(i): l.astype(np.float32) for i, l in zip(ann_ids, logits)}
