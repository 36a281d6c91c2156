"""Inductor's and Triton's on-disk caches in a folder that survives between gate runs, and is never trusted blindly.

    cache = activate()      # at process start, before torch compiles anything: validates, sets the env vars
    ...                     # pytest, python -m parity check (children inherit the env vars)
    seal(cache)             # after a run that finished: the stamp that makes the folder trusted next time

Layout: $SAMFAST_CACHE_DIR (default $XDG_CACHE_HOME/samfast, else ~/.cache/samfast) / <key> /
inductor (TORCHINDUCTOR_CACHE_DIR: FX-graph, AOT-autograd and autotune caches), triton
(TRITON_CACHE_DIR), pycache (PYTHONPYCACHEPREFIX: the child processes' Python bytecode) and
stamp.json. The key names torch, Triton, CUDA and the GPU(s), so a runner that upgrades torch or
changes GPU starts a fresh folder instead of reading kernels built for another.

Trust rule: a folder is used as it is only when stamp.json is readable, names this key, and its
manifest digest (relative path, size and sha256 of every file) matches the files on disk.
`activate` deletes the stamp while the run uses the folder, so a run that dies half-way leaves an
unstamped folder; that, a stamp of another key, a garbage stamp or a changed file (truncated,
deleted, added) moves the folder aside (<key>.stale-N, the newest one kept for a post-mortem) and
the run starts empty. An empty folder needs no stamp.

One run owns a folder at a time (an flock on <key>.lock beside it, held until the process ends):
a second run that starts meanwhile uses the folder the owner validated, without moving or sealing it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from parity.gate.devices import gpu_names

STAMP = "stamp.json"
ENV_ACTIVE = "SAMFAST_CACHE_ACTIVE"  # set by activate(): child processes use the folder as it is


def cache_root(env: os._Environ | dict = os.environ) -> Path:
    if env.get("SAMFAST_CACHE_DIR"):
        return Path(env["SAMFAST_CACHE_DIR"]).expanduser()
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "samfast"


def current_key() -> dict[str, str]:
    """What decides whether compiled artifacts can be reused: torch, Triton, CUDA, GPU models."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:
        triton = version("triton")
    except PackageNotFoundError:
        triton = "none"
    return {
        "torch": torch.__version__,
        "triton": triton,
        "cuda": torch.version.cuda or "none",
        "gpu": "+".join(sorted(set(gpu_names()))) or "cpu",
    }


def key_folder_name(key: dict[str, str]) -> str:
    """Readable and unique: e.g. torch2.11.0-triton3.5.0-cuda12.8-NVIDIA_H100_80GB_HBM3-1a2b3c4d."""
    readable = f"torch{key['torch']}-triton{key['triton']}-cuda{key['cuda']}-{key['gpu']}"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", readable)[:120] + "-" + digest


def manifest_digest(folder: Path) -> str:
    """sha256 over (relative path, size, content sha256) of every file but the stamp, in sorted order."""
    outer = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != STAMP):
        inner = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                inner.update(block)
        outer.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\0{inner.hexdigest()}\n".encode())
    return outer.hexdigest()


def why_untrusted(folder: Path, key: dict[str, str]) -> str | None:
    """None when the folder may be used as it is; else the reason it may not."""
    if not folder.exists() or not any(folder.iterdir()):
        return None
    try:
        stamp = json.loads((folder / STAMP).read_text())
        stamped_key, stamped_digest = stamp["key"], stamp["manifest_sha256"]
    except FileNotFoundError:
        return "no stamp (the last run using it did not finish)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable stamp ({type(err).__name__}: {err})"
    if stamped_key != key:
        return f"stamp is for another key {stamped_key}"
    if stamped_digest != manifest_digest(folder):
        return "files changed since the stamp (truncated, deleted, added or rewritten)"
    return None


def _move_aside(folder: Path) -> Path:
    for old in folder.parent.glob(folder.name + ".stale-*"):
        shutil.rmtree(old, ignore_errors=True)
    n = 0
    while (aside := folder.with_name(f"{folder.name}.stale-{n}")).exists():
        n += 1
    folder.rename(aside)
    return aside


@dataclass(frozen=True)
class CacheFolder:
    path: Path
    owned: bool  # this process holds the lock: it validated the folder and seals it
    started_empty: bool  # a cold run: nothing compiled to reuse


_held_locks: dict[Path, object] = {}  # folder -> its open lock file: held until release() or the process ends


def _try_lock(folder: Path) -> bool:
    handle = open(folder.with_name(folder.name + ".lock"), "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _held_locks[folder] = handle
    return True


def release(cache: CacheFolder) -> None:
    """Let another run own the folder (seal() does this; without seal the folder stays untrusted)."""
    handle = _held_locks.pop(cache.path, None)
    if handle is not None:
        handle.close()  # closing the file drops the flock


def activate(root: Path | None = None, key: dict[str, str] | None = None, env: os._Environ | dict = os.environ) -> CacheFolder:
    """Validate (or reset) the folder of this key and point inductor and Triton at it through `env`."""
    key = key or current_key()
    folder = (root or cache_root(env)) / key_folder_name(key)
    folder.parent.mkdir(parents=True, exist_ok=True)
    owned = _try_lock(folder)
    if owned:
        reason = why_untrusted(folder, key)
        if reason:
            aside = _move_aside(folder)
            print(f"compile cache {folder}: not trusted ({reason}); moved to {aside.name}, starting empty")
        folder.mkdir(exist_ok=True)
        (folder / STAMP).unlink(missing_ok=True)  # in use: unstamped until seal()
        (folder / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
    else:
        print(f"compile cache {folder}: in use by another run; sharing it without validating or sealing")
        folder.mkdir(exist_ok=True)
    # what was compiled lives in inductor/ and triton/ (the gate also keeps its test times here)
    started_empty = not any(any(sub.iterdir()) for sub in (folder / "inductor", folder / "triton") if sub.is_dir())
    keep_bytecode_in(folder, env)
    env.update({
        ENV_ACTIVE: str(folder),
        "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
        "TRITON_CACHE_DIR": str(folder / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    })
    return CacheFolder(folder, owned, started_empty)


def keep_bytecode_in(folder: Path, env: os._Environ | dict) -> None:
    """Child processes keep their Python bytecode in the folder (set in `env`), unless the caller chose a prefix.

    Container images often set PYTHONDONTWRITEBYTECODE or install site-packages without bytecode
    (the H100 runner's torch: no .pyc among 2141 .py files), and then every process the gate starts
    (xdist workers, inductor's compile workers, the CLI tests' interpreters) compiles torch's source
    again: on that runner a CPU compile check took 75 s warm, and 58 s with bytecode
    (docs/gpu-gate.md, session 11). Under a prefix the bytecode stays out of the installed tree, which
    is what PYTHONDONTWRITEBYTECODE is usually set to protect; a corrupt file fails the folder's digest.
    """
    if env.get("PYTHONPYCACHEPREFIX"):
        return
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")


def seal(cache: CacheFolder) -> None:
    """Stamp the folder as complete (after a run that finished, whatever its tests' verdict); owner only."""
    if not cache.owned:
        return
    folder = cache.path
    key = json.loads((folder / "key.json").read_text())
    stamp = {"key": key, "manifest_sha256": manifest_digest(folder)}
    tmp = folder / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    tmp.replace(folder / STAMP)  # the stamp appears whole or not at all
    release(cache)
