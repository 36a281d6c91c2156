"""What every golden shares, whatever its task: where goldens live and how a folder is named, the
identity fields a golden must match (model, checkpoint, dataset, prompt policy), the true-fp32
settings recorded with it, content hashes, and deterministic encodings (gzipped JSON, npz) of the
bytes a task stores through the store (parity/golden/store.py). A task's own files: parity/tasks/<task>/golden.py.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import math
import os
import platform
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

import samfast
from parity.golden.store import GoldenError, GoldenMissing  # noqa: F401 (GoldenMissing: callers catch it from here)

GOLDEN_ROOT = Path(__file__).resolve().parents[2] / "golden"
# cuBLAS is deterministic only with a fixed workspace (PyTorch's reproducibility notes)
CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"


class GoldenMismatch(GoldenError):
    """A golden that was made from other inputs (or by another format) than the ones being checked."""


class UselessGolden(GoldenError):
    """Outputs that would make a golden that checks nothing (no annotations) or nothing sane (NaN)."""


def golden_dir_name(model_type: str, checkpoint_id: str, dataset_name: str, limit: int | None, prompt: str) -> str:
    parts = [model_type, checkpoint_id, dataset_name] + ([f"limit{limit}"] if limit else []) + ([prompt] if prompt != "point" else [])
    return "-".join(parts)


def no_tf32() -> None:
    """fp32 matmuls and convolutions in true fp32 on the GPU. The golden is made so, and a check runs so:
    PyTorch's default runs cuDNN's convolutions in TF32 (a 10-bit mantissa), and an fp32 stage checked
    under that default differed from its golden made on the same H200 by 1.8e-4 in the logits and
    2.3e-3 in the object scores after 100 tracked frames (the video gate's fp32 limit: 1e-3)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@contextlib.contextmanager
def fp32_settings() -> Iterator[dict]:
    """True fp32 inside the block: no TF32, deterministic algorithms where PyTorch has them; yields what
    the manifest records. Everything is put back as found after the block: a golden made in a process
    that goes on (a notebook, a test session) must not leave it slower or change what its next graphs
    trace (with deterministic algorithms on, torchvision's roi_align wrapper calls a function dynamo
    skips)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    workspace = os.environ.get(CUBLAS_WORKSPACE)
    no_tf32()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault(CUBLAS_WORKSPACE, ":4096:8")
    try:
        yield {
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "deterministic_algorithms": True,
        }
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
         torch.backends.cudnn.benchmark) = saved[:4]
        torch.use_deterministic_algorithms(saved[4], warn_only=saved[5])
        if workspace is None:
            os.environ.pop(CUBLAS_WORKSPACE, None)


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {platform.processor() or 'unknown processor'})"


def provenance(folder: Path, manifest: dict, device: torch.device) -> dict[str, str | None]:
    """Where a check's golden came from and where the check ran: the report header's shared rows."""
    return {
        "golden": str(folder),
        "golden_device": manifest.get("device"),
        "golden_torch": manifest.get("torch_version"),
        "device": device_description(device),
        "torch": torch.__version__,
    }


def state_dict_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """Content hash of weights (for synthetic checkpoints, which have no file)."""
    digest = hashlib.sha256()
    for key in sorted(state_dict):
        digest.update(key.encode())
        tensor = state_dict[key]
        # a complex table (SAM 3's RoPE frequencies) as its (real, imaginary) pairs: .float() drops the imaginary
        tensor = torch.view_as_real(tensor) if tensor.is_complex() else tensor
        digest.update(tensor.float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gzip_json(value) -> bytes:
    """JSON, gzipped with no timestamp and no file name: the same records give the same bytes."""
    out = io.BytesIO()
    # gzip: masks of seeded weights are noise with long RLEs; trained ones compress far better.
    # Level 6, not 9: on 200 seeded-weight scenes (184 MB of JSON) 9 took 104 s and 6 took 10 s for
    # a file 7% larger; at 9 rank 0's write cost more than the model on 1000 scenes.
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=6, mtime=0) as f:
        f.write(json.dumps(value, separators=(",", ":"), sort_keys=True).encode())
    return out.getvalue()


def npz(arrays: dict[str, np.ndarray]) -> bytes:
    """An npz that np.load reads, with fixed zip timestamps and modes: the same arrays, the same bytes.

    LZMA, not np.savez_compressed's deflate: the committed goldens travel to every GPU call, and on
    their fp16 logits LZMA is 15-21% smaller (np.load reads both; tests/unit/test_tracked_size.py)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_LZMA) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type, info.external_attr = zipfile.ZIP_LZMA, 0o644 << 16
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.ascontiguousarray(array), allow_pickle=False)
            archive.writestr(info, npy.getvalue())
    return out.getvalue()


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
