"""TEMPORARY stand-in for parity.store (being built on the `store` branch), with its exact signature.

Deleted when parity.store lands on main; nothing but parity.amg.golden imports it. It is not
crash-safe and takes no lock: only the real store is.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path


class GoldenError(ValueError):
    """A golden that cannot be used as it is."""


class GoldenMissing(GoldenError, FileNotFoundError):
    """No golden where one was expected."""


class GoldenCorrupt(GoldenError):
    """A golden file missing, truncated, edited or unreadable."""


def publish(folder: Path, files: dict[str, bytes], manifest: dict) -> Path:
    folder = Path(folder)
    manifest = {**manifest, "files": {n: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)} for n, b in files.items()}}
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return folder


def read(folder: Path, regenerate: str) -> tuple[dict, dict[str, bytes]]:
    folder = Path(folder)
    if not (folder / "manifest.json").is_file():
        raise GoldenMissing(f"no golden at {folder}. Make one with:\n  {regenerate}")
    manifest = json.loads((folder / "manifest.json").read_text())
    files = {}
    for name, entry in manifest["files"].items():
        path = folder / name
        data = path.read_bytes() if path.is_file() else b""
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise GoldenCorrupt(f"golden file {path} is missing or altered. Regenerate the golden with:\n  {regenerate}")
        files[name] = data
    return manifest, files
