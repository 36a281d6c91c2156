"""Inductor's and Triton's on-disk caches in a folder that survives between gate runs, and is never trusted blindly.

    cache = activate()      # at process start, before torch compiles anything: validates, sets the env vars
    ...                     # pytest, python -m parity check (children inherit the env vars)
    seal(cache)             # after a run that finished: the stamp that makes the folder trusted next time

Layout: $SAMFAST_CACHE_DIR (default $XDG_CACHE_HOME/samfast, else ~/.cache/samfast) / <key> /
inductor (TORCHINDUCTOR_CACHE_DIR: FX-graph, AOT-autograd and autotune caches), triton
(TRITON_CACHE_DIR), pycache (PYTHONPYCACHEPREFIX: the child processes' Python bytecode, parity.gate.bytecode), key.json,
stamp.json and, while a run uses the folder, in-use.json. The key names torch, Triton, CUDA, the
GPU(s) and the compile settings, so a runner that upgrades torch or changes GPU starts a fresh
folder instead of reading kernels built for another.

Trust rule. `seal` writes stamp.json: the key and every file's size and sha256. `activate` writes
in-use.json, which only `seal` removes (after the new stamp), so a run that dies leaves the marker.
- Fast path: a stamp of this key, no marker, and the files on disk exactly the stamp's: used as is.
- A stamp or key.json of another key: the folder is moved aside (<key>.stale-N, the newest kept for
  a post-mortem) and the run starts empty.
- Otherwise (a killed run, a changed file) the folder is trusted entry by entry, because inductor's
  and Triton's entries are content-addressed and mostly written atomically, so what a killed run
  finished is good: a file the stamp lists is kept iff its sha256 still matches; any other file (the
  unfinished run's) is kept iff it passes the check for its kind (`entry_is_whole`); half-written
  temporaries go, and so does a Triton kernel folder whose group file is missing or names a file that
  is not there. A dropped entry is rebuilt by the next compile; it is never read.

One run owns a folder at a time (an flock on <key>.lock beside it, held until the process ends):
a second run that starts meanwhile uses the folder the owner validated, without moving or sealing it.
Every run also holds <key>.users shared while it uses the folder, and an owner validates only when it
can take that lock alone: a run that started under an earlier owner and outlives it keeps its folder
(a validation then would drop the entries it is still writing; seen once, 989 of them), and a
run that starts while an owner validates waits for it.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import marshal
import os
import pickletools
import re
import shutil
import struct
import types
from dataclasses import dataclass, field
from pathlib import Path

from parity.gate import bytecode
from parity.gate.devices import gpu_names
from parity.golden.manifest import file_sha256

STAMP = "stamp.json"
IN_USE = "in-use.json"  # a run uses (or used and died using) the folder; removed by seal()
KEY_FILE = "key.json"
BOOKKEEPING = {STAMP, IN_USE}  # about the folder, not part of it: never listed in a stamp
ENV_ACTIVE = "SAMFAST_CACHE_ACTIVE"  # set by activate(): child processes use the folder as it is
# Environment that changes what samfast compiles (the mode a model is compiled in, the sparse
# kernels it picks). Modes set per build inside a run (parity.gate.models, the checks' `default`)
# share one folder: inductor's own cache keys include the config a mode sets.
COMPILE_SETTINGS = ("SAMFAST_COMPILE_MODE", "SPARSE_BACKEND")


def cache_root(env: os._Environ | dict = os.environ) -> Path:
    if env.get("SAMFAST_CACHE_DIR"):  # absolute: inductor hands these paths to processes in other folders
        return Path(env["SAMFAST_CACHE_DIR"]).expanduser().absolute()
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "samfast"


def current_key(env: os._Environ | dict = os.environ) -> dict[str, str]:
    """What decides whether compiled artifacts can be reused: torch, Triton, CUDA, GPU models, compile settings."""
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
        "compile": " ".join(f"{name}={env[name]}" for name in COMPILE_SETTINGS if env.get(name)) or "defaults",
    }


def key_folder_name(key: dict[str, str]) -> str:
    """Readable and unique: e.g. torch2.11.0-triton3.5.0-cuda12.8-NVIDIA_H100_80GB_HBM3-1a2b3c4d."""
    readable = f"torch{key['torch']}-triton{key['triton']}-cuda{key['cuda']}-{key['gpu']}"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", readable)[:120] + "-" + digest


# --- what is on disk ---------------------------------------------------------------------------
def list_files(folder: Path) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file but the bookkeeping (the stamp's own format)."""
    return {path.relative_to(folder).as_posix(): [path.stat().st_size, file_sha256(path)]
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name not in BOOKKEEPING}


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_stamp(folder: Path) -> dict | None:
    """The last seal's stamp, or None (no stamp, a torn one, or one of an older format)."""
    stamp = _read_json(folder / STAMP)
    if isinstance(stamp, dict) and isinstance(stamp.get("key"), dict) and isinstance(stamp.get("files"), dict):
        return stamp
    return None


def recorded_key(folder: Path) -> dict | None:
    """The key the folder's compiled files were built for: the stamp's, else key.json's (a run that never sealed)."""
    stamp = read_stamp(folder)
    return stamp["key"] if stamp else _read_json(folder / KEY_FILE)


def why_untrusted(folder: Path, key: dict[str, str], files: dict[str, list] | None = None) -> str | None:
    """None when the folder may be used as it is (the fast path); else why it may not. `files`: list_files(folder)."""
    if not folder.exists() or not any(folder.iterdir()):
        return None
    stamp = read_stamp(folder)
    if stamp is None:
        return "no stamp: no run using it has finished"
    if stamp["key"] != key:
        return f"stamp is for another key {stamp['key']}"
    if (folder / IN_USE).exists():
        return "the last run using it did not finish"
    if (files if files is not None else list_files(folder)) != stamp["files"]:
        return "files changed since the stamp (truncated, deleted, added or rewritten)"
    return None


# --- what a killed writer leaves ----------------------------------------------------------------
def is_temporary(relative: str) -> bool:
    """Half-written files that their writer renames into place when done, so one left over is a dead writer's:
    inductor's write_atomic and this module's (.<name>.tmp), Triton's FileCacheManager.put (a folder
    tmp.pid_<pid>_<uuid>), importlib's bytecode writer (<name>.pyc.<id>)."""
    parts = relative.split("/")
    name = parts[-1]
    return (name.startswith(".") and name.endswith(".tmp")) or bool(re.search(r"\.pyc\.\d+$", name)) \
        or any(part.startswith("tmp.pid_") for part in parts[:-1])


@dataclass(frozen=True)
class _ElfClass:
    """Where the fields elf_is_whole reads lie in ELF32 or ELF64 (offsets in the file or in a section header)."""
    header_size: int
    word: str  # struct code of an offset
    shoff_at: int  # e_shoff
    shentsize_at: int  # e_shentsize, then e_shnum
    section_size: int  # the smallest valid e_shentsize
    sh_offset_at: int  # sh_offset, then sh_size (sh_type is at 4 in both)


_ELF_CLASSES = {1: _ElfClass(52, "I", 32, 46, 40, 16), 2: _ElfClass(64, "Q", 40, 58, 64, 24)}
_SECTIONS_WITHOUT_BYTES = (0, 8)  # SHT_NULL, SHT_NOBITS (.bss): they take no room in the file


def elf_is_whole(path: Path) -> bool:
    """An ELF (.so, .o, .cubin) whose section header table, and every section it lists, lies inside the file.
    The compiler writes these in place, not atomically, so a killed build leaves a short file, and the
    section header table is what a linker writes last."""
    with open(path, "rb") as f:
        header = f.read(64)
        size = os.fstat(f.fileno()).st_size
        if header[:4] != b"\x7fELF" or len(header) < 6 or header[4] not in _ELF_CLASSES or header[5] not in (1, 2):
            return False
        elf, order = _ELF_CLASSES[header[4]], "<" if header[5] == 1 else ">"
        if len(header) < elf.header_size:
            return False
        (shoff,) = struct.unpack_from(order + elf.word, header, elf.shoff_at)
        shentsize, shnum = struct.unpack_from(order + "HH", header, elf.shentsize_at)
        if shnum == 0 or shentsize < elf.section_size or shoff + shnum * shentsize > size:
            return False
        f.seek(shoff)
        table = f.read(shnum * shentsize)
    for start in range(0, len(table), shentsize):
        (kind,) = struct.unpack_from(order + "I", table, start + 4)
        offset, length = struct.unpack_from(order + 2 * elf.word, table, start + elf.sh_offset_at)
        if kind not in _SECTIONS_WITHOUT_BYTES and offset + length > size:
            return False
    return True


def pickle_is_whole(path: Path) -> bool:
    """Inductor's FX-graph and AOT-autograd entries are pickles. Torch reads them with pickle.loads; here
    the opcode stream is only walked (pickletools.genops): it must end in STOP at the file's last byte.
    That is what an interrupted write breaks, costs ~2 ms per entry, imports and executes nothing
    (unpickling would import inductor and build its objects in the gate's own process)."""
    data = path.read_bytes()
    last = None
    for last in pickletools.genops(data):
        pass
    return last is not None and last[0].name == "STOP" and last[2] == len(data) - 1


def pyc_is_whole(path: Path) -> bool:
    """This Python's magic number and a 16-byte header, then a code object that marshal loads."""
    data = path.read_bytes()
    return data[:4] == importlib.util.MAGIC_NUMBER and isinstance(marshal.loads(data[16:]), types.CodeType)


def entry_is_whole(folder: Path, relative: str) -> bool:
    """The check for an entry that no stamp vouches for, by its kind. Kinds without one (.cpp, .h,
    .ptx, .ttir, ...) are written whole by write_atomic or Triton's put, or are empty lock files.
    A check that fails in any way counts as a failure: the entry is rebuilt, never trusted."""
    path = folder / relative
    try:
        if path.suffix in (".so", ".o", ".cubin", ".hsaco"):
            return elf_is_whole(path)
        if path.suffix == ".pyc":
            return pyc_is_whole(path)
        if path.suffix == "" and relative.startswith(("inductor/fxgraph/", "inductor/aotautograd/")):
            return pickle_is_whole(path)
        if path.suffix in (".json", ".best_config"):
            json.loads(path.read_bytes())
        elif path.suffix == ".py":
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        return True
    except Exception:  # whatever the reason, an entry that cannot be checked is rebuilt
        return False


def triton_kernel_is_complete(kernel: Path) -> bool:
    """Triton writes a kernel's files, then its __grp__<name>.json listing them (by absolute path, which
    it checks before use): no group, a torn one, or one naming a missing file means an unfinished kernel.
    Folders of .so files alone are Triton's launcher stubs, written in one piece without a group."""
    files = [p for p in kernel.iterdir() if p.is_file()]
    if all(p.suffix == ".so" for p in files):
        return True
    groups = [p for p in files if p.name.startswith("__grp__") and p.suffix == ".json"]
    if not groups:
        return False
    for group in groups:
        record = _read_json(group)
        children = record.get("child_paths") if isinstance(record, dict) else None
        if not isinstance(children, dict) or not all((kernel / Path(str(p)).name).is_file() for p in children.values()):
            return False
    return True


@dataclass
class EntryCounts:
    """What trusting entry by entry kept and dropped, by why."""

    kept: int = 0
    temporaries: int = 0
    kernel_files: int = 0  # files of incomplete Triton kernels
    kernels: int = 0
    failed: int = 0

    def line(self) -> str:
        dropped = self.temporaries + self.kernel_files + self.failed
        return (f"kept {self.kept} files, dropped {dropped} ({self.temporaries} temporaries, {self.kernel_files} "
                f"in {self.kernels} incomplete Triton kernels, {self.failed} failed validation)")


def trust_entry_by_entry(folder: Path, on_disk: dict[str, list], stamped: dict[str, list]) -> EntryCounts:
    """Delete what cannot be trusted: temporaries, stamped files that changed, unstamped files that fail their
    check, incomplete Triton kernels, and inductor's .so.load_ok markers whose library went."""
    outcome = EntryCounts()
    for relative, size_and_sha in on_disk.items():
        path = folder / relative
        if is_temporary(relative):
            path.unlink()
            outcome.temporaries += 1
        elif not (size_and_sha == stamped[relative] if relative in stamped else entry_is_whole(folder, relative)):
            path.unlink()
            outcome.failed += 1
    triton = folder / "triton"
    for leftover in triton.glob("*/tmp.pid_*"):  # Triton's temporary folders, now empty
        shutil.rmtree(leftover)
    for kernel in sorted(p for p in triton.iterdir() if p.is_dir()) if triton.is_dir() else []:
        if not triton_kernel_is_complete(kernel):
            outcome.kernel_files += sum(1 for p in kernel.rglob("*") if p.is_file())
            outcome.kernels += 1
            shutil.rmtree(kernel)
    for marker in folder.glob("inductor/**/*.so.load_ok"):
        if not marker.with_suffix("").exists():
            marker.unlink()
            outcome.failed += 1
    outcome.kept = sum(1 for p in folder.rglob("*") if p.is_file() and p.name not in BOOKKEEPING)
    return outcome


def _move_aside(folder: Path) -> Path:
    for old in folder.parent.glob(folder.name + ".stale-*"):
        shutil.rmtree(old, ignore_errors=True)
    n = 0
    while (aside := folder.with_name(f"{folder.name}.stale-{n}")).exists():
        n += 1
    folder.rename(aside)
    return aside


def settle(folder: Path, key: dict[str, str]) -> tuple[bool, str]:
    """Make the folder trustworthy for this key (see the module's trust rule); returns whether it was
    trusted entry by entry (an unfinished or damaged run's folder: the gate's time budget for such a
    run lies between warm and cold) and what happened, in words."""
    if not folder.exists() or not any(folder.iterdir()):
        return False, "cold (empty)"
    recorded = recorded_key(folder)
    if recorded is not None and recorded != key:
        aside = _move_aside(folder)
        return False, f"cold (built for another key {recorded}; moved to {aside.name})"
    on_disk = list_files(folder)
    reason = why_untrusted(folder, key, on_disk)
    if reason is None:
        return False, f"sealed, verified ({len(on_disk)} files)"
    stamp = read_stamp(folder)
    outcome = trust_entry_by_entry(folder, on_disk, stamp["files"] if stamp else {})
    what = "resumed an unfinished run's entries" if stamp is None or (folder / IN_USE).exists() else reason
    return True, f"{what}: {outcome.line()}"


# --- a run's use of the folder ----------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    """The file appears whole or not at all; a dead writer's temporary is dropped by the next activate."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


@dataclass(frozen=True)
class CacheFolder:
    path: Path
    owned: bool  # this process holds the lock: it seals the folder (and validated it, unless others used it)
    started_empty: bool  # a cold run: nothing compiled to reuse
    resumed: bool = False  # trusted entry by entry: a killed (or damaged) run's folder, not a sealed one
    locks: tuple = field(default=(), compare=False, repr=False)  # its open lock files, held until release()


_open_locks: list = []  # every lock file this process holds open (what a killed process lets go of)


def _flock(folder: Path, suffix: str, operation: int):
    """The folder's lock file <key><suffix>, opened and locked by flock(operation): its handle, or None where
    a non-blocking operation found the lock taken."""
    handle = open(folder.with_name(folder.name + suffix), "a")
    try:
        fcntl.flock(handle, operation)
    except OSError:
        handle.close()
        return None
    _open_locks.append(handle)
    return handle


def release(cache: CacheFolder) -> None:
    """Let another run own and validate the folder (seal() does this; without seal the folder keeps its in-use marker)."""
    for handle in cache.locks:
        if handle in _open_locks:
            _open_locks.remove(handle)
        handle.close()  # closing the file drops the flock


def activate(root: Path | None = None, key: dict[str, str] | None = None, env: os._Environ | dict = os.environ) -> CacheFolder:
    """Validate (or reset) the folder of this key and point inductor and Triton at it through `env`."""
    key = key or current_key(env)
    folder = (root or cache_root(env)) / key_folder_name(key)
    folder.parent.mkdir(parents=True, exist_ok=True)
    owner = _flock(folder, ".lock", fcntl.LOCK_EX | fcntl.LOCK_NB)
    alone = _flock(folder, ".users", fcntl.LOCK_EX | fcntl.LOCK_NB) if owner else None  # no run uses the folder
    resumed = False
    if alone:
        resumed, what = settle(folder, key)
        print(f"compile cache {folder}: {what}", flush=True)
        fcntl.flock(alone, fcntl.LOCK_SH)  # validated: other runs may use it now
    elif owner:
        print(f"compile cache {folder}: still used by a run that started under an earlier owner; this run owns it "
              "(and seals it) without validating it")
    else:
        print(f"compile cache {folder}: in use by another run; sharing it without validating or sealing")
    users = alone or _flock(folder, ".users", fcntl.LOCK_SH)  # waits while an owner validates
    folder.mkdir(exist_ok=True)
    if owner:
        write_atomic(folder / IN_USE, json.dumps({"pid": os.getpid()}) + "\n")  # before anything compiles
        write_atomic(folder / KEY_FILE, json.dumps(key, indent=1, sort_keys=True) + "\n")
    # what was compiled lives in inductor/ and triton/ (the gate also keeps its test times here)
    started_empty = not any(p.is_file() for sub in ("inductor", "triton") for p in (folder / sub).rglob("*"))
    bytecode.keep_in(folder, env)
    env.update({
        ENV_ACTIVE: str(folder),
        "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
        "TRITON_CACHE_DIR": str(folder / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    })
    locks = tuple(handle for handle in (owner, users) if handle)
    return CacheFolder(folder, owner is not None, started_empty, resumed and not started_empty, locks)


def seal(cache: CacheFolder) -> None:
    """Stamp the folder as complete (after a run that finished, whatever its tests' verdict); owner only.

    The stamp comes first, then the marker goes: a run killed in between leaves a stamp that vouches
    for every file, and the next run keeps them all. Temporaries (a sharing run still writing) are
    left out of the stamp, so the next run drops them."""
    if not cache.owned:
        return
    folder = cache.path
    files = {relative: entry for relative, entry in list_files(folder).items() if not is_temporary(relative)}
    key = json.loads((folder / KEY_FILE).read_text())
    write_atomic(folder / STAMP, json.dumps({"key": key, "files": files}, indent=0, sort_keys=True) + "\n")
    (folder / IN_USE).unlink(missing_ok=True)
    release(cache)
