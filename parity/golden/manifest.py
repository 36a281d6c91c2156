"""Golden fp32 outputs on disk: JSON + compressed NPZ (never pickle), through the store (parity/store.py).

A golden folder holds manifest.json (what produced it, and the sha256 of each file), predictions.json.gz
(per annotation: the three multimask masks as RLE, the predicted IoUs, the best index, IoU vs ground
truth) and logits.npz (fp16 low-res logits of a bounded subset of annotations). This module turns
StageOutputs into those files' bytes, deterministically, and back, refusing (GoldenCorrupt) anything
that is not a golden the gate can trust: the store checks the bytes, this module the records in them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import platform
import zipfile
import zlib
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch

import samfast
from parity import store
from parity.evaluate import AnnotationOutput, StageOutputs
from parity.store import GoldenError, GoldenMissing  # noqa: F401 (GoldenMissing: callers catch it from here)

GOLDEN_ROOT = Path(__file__).resolve().parents[1] / "golden"
FORMAT_VERSION = 2  # 2: the manifest lists each file's sha256 (parity/store.py); 1 had no checksums
PREDICTIONS, LOGITS = "predictions.json.gz", "logits.npz"
CONTENT_FILES = (PREDICTIONS, LOGITS)
RECORD_FIELDS = {f.name for f in fields(AnnotationOutput)}
DEFAULT_REGENERATE = "python -m parity golden ... (the golden's model, checkpoint and data; or `nox -s golden`)"


class GoldenMismatch(GoldenError):
    """A golden that was made from other inputs (or by another format) than the ones being checked."""


class UselessGolden(GoldenError):
    """Outputs that would make a golden that checks nothing (no annotations) or nothing sane (NaN)."""


def golden_dir_name(model_type: str, checkpoint_id: str, dataset_name: str, limit: int | None, prompt: str) -> str:
    parts = [model_type, checkpoint_id, dataset_name] + ([f"limit{limit}"] if limit else []) + ([prompt] if prompt != "point" else [])
    return "-".join(parts)


def fp32_settings() -> dict:
    """True fp32: no TF32, deterministic algorithms where PyTorch has them (recorded in the manifest)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return {
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": True,
    }


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {platform.processor() or 'unknown processor'})"


def state_dict_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """Content hash of weights (for synthetic checkpoints, which have no file)."""
    digest = hashlib.sha256()
    for key in sorted(state_dict):
        digest.update(key.encode())
        digest.update(state_dict[key].float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _gzip_json(value) -> bytes:
    """JSON, gzipped with no timestamp and no file name: the same records give the same bytes."""
    out = io.BytesIO()
    # gzip: masks of seeded weights are noise with long RLEs; trained ones compress far better.
    # Level 6, not 9: on 200 seeded-weight scenes (184 MB of JSON) 9 took 104 s and 6 took 10 s for
    # a file 7% larger; at 9 rank 0's write cost more than the model on 1000 scenes.
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=6, mtime=0) as f:
        f.write(json.dumps(value, separators=(",", ":"), sort_keys=True).encode())
    return out.getvalue()


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    """What np.savez_compressed writes, with fixed zip timestamps and modes: the same arrays, the same bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.ascontiguousarray(array), allow_pickle=False)
            archive.writestr(info, npy.getvalue())
    return out.getvalue()


def encode_golden(outputs: StageOutputs) -> dict[str, bytes]:
    """The golden's content files as bytes, deterministically."""
    ann_ids = np.array(list(outputs.logits), dtype=np.int64)
    # an empty table is written only by tests of the reader (make_golden refuses such outputs first)
    stacked = np.stack([outputs.logits[i] for i in ann_ids]).astype(np.float16) if len(ann_ids) else np.zeros((0, 3, 256, 256), np.float16)
    return {
        PREDICTIONS: _gzip_json([asdict(a) for a in outputs.annotations]),
        LOGITS: _npz({"ann_ids": ann_ids, "logits": stacked}),
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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _record_problem(record) -> str | None:
    """What is wrong with one predictions record, or None."""
    if not isinstance(record, dict) or set(record) != RECORD_FIELDS:
        return f"has keys {sorted(record) if isinstance(record, dict) else type(record).__name__}, not {sorted(RECORD_FIELDS)}"
    if not all(_is_int(record[k]) for k in ("ann_id", "image_id", "category_id", "best")):
        return "has a non-integer id or best index"
    scores, rles = record["scores"], record["rles"]
    if not (isinstance(scores, list) and len(scores) == 3 and all(_is_number(x) for x in scores)):
        return "does not hold three finite scores"
    if record["best"] not in (0, 1, 2) or not _is_number(record["gt_iou"]):
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
    if not _is_int(count) or len(records) != count:
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
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as err:
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


IDENTITY_FIELDS = {
    "model_type": "model type",
    "checkpoint_sha256": "checkpoint",
    "dataset_fingerprint": "dataset (annotations, image subset or limit)",
    "prompt_policy": "prompt policy",
}


def verify_matches(manifest: dict, expected: dict, folder: Path, regenerate: str) -> None:
    """Refuse a golden made from another checkpoint, dataset or prompt policy, saying which and how to fix."""
    for key, what in IDENTITY_FIELDS.items():
        if manifest.get(key) != expected[key]:
            golden_label = f" ({manifest['checkpoint']})" if key == "checkpoint_sha256" and "checkpoint" in manifest else ""
            raise GoldenMismatch(
                f"golden {folder} was made from another {what}: golden has {key}={manifest.get(key)!r}{golden_label}, "
                f"this run has {expected[key]!r}. Comparing them would measure the difference in inputs, "
                f"not in the model. Regenerate the golden with:\n  {regenerate}"
            )


def base_manifest(model_type: str, checkpoint_label: str, checkpoint_sha: str, dataset, prompt: str, device: torch.device) -> dict:
    return {
        "model_type": model_type,
        "checkpoint": checkpoint_label,
        "checkpoint_sha256": checkpoint_sha,
        "dataset": dataset.manifest(),
        "dataset_fingerprint": dataset.fingerprint,
        "prompt_policy": dataset.manifest()["prompt_policy" if prompt == "point" else "box_policy"],
        "samfast_version": samfast.__version__,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device": device_description(device),
    }
