"""Golden fp32 outputs on disk: JSON + compressed NPZ (never pickle), written whole or not at all.

A golden folder holds manifest.json (what produced it), predictions.json.gz (per annotation: the
three multimask masks as RLE, the predicted IoUs, the best index, IoU vs ground truth) and
logits.npz (fp16 low-res logits of a bounded subset of annotations).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

import samfast
from parity.evaluate import AnnotationOutput, StageOutputs

GOLDEN_ROOT = Path(__file__).resolve().parents[1] / "golden"
FORMAT_VERSION = 1


class GoldenMismatch(ValueError):
    """A golden that was made from other inputs than the ones being checked."""


class GoldenMissing(FileNotFoundError):
    """No golden where one was expected."""


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


def write_golden(folder: Path, outputs: StageOutputs, manifest: dict) -> Path:
    """Write into a temporary sibling folder, then swap it in: the old golden survives any failure."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        manifest = {**manifest, "format_version": FORMAT_VERSION, "annotations": len(outputs.annotations)}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        records = [asdict(a) for a in outputs.annotations]
        # gzip: masks of seeded weights are noise with long RLEs; trained ones compress far better
        with gzip.open(staging / "predictions.json.gz", "wt", compresslevel=9) as f:
            json.dump(records, f, separators=(",", ":"))
        ann_ids = np.array(list(outputs.logits), dtype=np.int64)
        stacked = np.stack([outputs.logits[i] for i in ann_ids]).astype(np.float16) if len(ann_ids) else np.zeros((0, 3, 256, 256), np.float16)
        np.savez_compressed(staging / "logits.npz", ann_ids=ann_ids, logits=stacked)
        old = folder.with_name(f".{folder.name}.old")
        if folder.exists():
            if old.exists():
                shutil.rmtree(old)
            folder.rename(old)
        staging.rename(folder)
        if old.exists():
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def read_golden(folder: Path) -> tuple[dict, StageOutputs]:
    folder = Path(folder)
    if not (folder / "manifest.json").is_file():
        raise GoldenMissing(
            f"no golden at {folder} (no manifest.json). Make one with `python -m parity golden` "
            "(or `nox -s golden`) for this model, checkpoint and dataset."
        )
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GoldenMismatch(f"golden {folder} has format {manifest.get('format_version')}, this parity reads {FORMAT_VERSION}; regenerate it")
    with gzip.open(folder / "predictions.json.gz", "rt") as f:
        records = json.load(f)
    with np.load(folder / "logits.npz", allow_pickle=False) as npz:
        logits = {int(i): l.astype(np.float32) for i, l in zip(npz["ann_ids"], npz["logits"])}
    outputs = StageOutputs([AnnotationOutput(**r) for r in records], logits, 0, 0.0, 0, 0.0)
    return manifest, outputs


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
