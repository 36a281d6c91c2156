"""A crash-safe, verified store of golden folders: publish a set of files whole, read them back checked.

Every golden (point goldens, AMG goldens, multi-rank runs) is one folder `<root>/<name>/` holding its
content files and a manifest.json that records the sha256 and size of each. Beside it, while a writer
works, live three hidden siblings (gitignored, never part of a golden):

    .<name>.lock   the lock (flock); its text says who holds it (pid, host, command, since when)
    .<name>.new/   the next golden, being staged
    .<name>.old/   the previous golden, during the swap

Why a reader always finds a complete golden (the old one or the new one, never neither)
---------------------------------------------------------------------------------------
publish() makes these filesystem steps, each durable (fsync) before the next begins:

    1. mkdir .new; write each file into it and fsync it; fsync .new    -- <name> untouched
    2. rename <name> -> .old; fsync the root                          -- <name> absent, .old complete
    3. rename .new -> <name>; fsync the root                          -- <name> is the new golden
    4. remove .old                                                    -- done

A rename within one folder is atomic, so a writer killed anywhere leaves one of these states:
(a) <name> is the old golden and a partial or complete .new lies beside it (died in 1);
(b) <name> is absent and .old is the complete old golden (died between 2 and 3);
(c) <name> is the new golden and a complete or partly removed .old lies beside it (died in 3 or 4).
Recovery, run under the lock by the next writer and by every reader that sees a leftover, restores
.old to <name> when <name> is absent (b), then removes .new and .old ((a), (c)). A writer that died
before step 3 therefore never published: the previous golden stands. Recovery itself is made of the
same atomic steps, so a recovery that is killed is finished by the next one. Staging folders left by
the store's previous writer (`.<name>.XXXXXXXX`, made by tempfile.mkdtemp) are removed the same way.

One writer at a time: publish() holds an exclusive flock on .<name>.lock for all four steps and
readers a shared one while they read, so no reader sees a swap half done. The kernel drops a flock
when its process dies, so a killed writer never leaves a stale lock behind. The lock file is
removed by the last holder; a locker checks that the file it locked is still the one at the path.

Why the contents can be trusted: the manifest records the sha256 and size of every content file,
and read() verifies all of them before it returns a byte, so a truncated, edited, deleted or
damaged file is refused (GoldenCorrupt) naming the file, what is wrong and the regenerate command.

Reproducible: the same files and manifest give the same bytes (manifest keys sorted, no
timestamps), with modes 0644 for files and 0755 for the folder, whatever the umask.

Every filesystem step goes through `_fs`, one method call per step, so tests can kill a writer at
each step in turn (tests/parity/test_golden_store.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

MANIFEST = "manifest.json"
READ_WAIT_S = 60.0  # a reader waits this long for a writer (a publish of in-memory bytes takes seconds)
WRITE_WAIT_S = 5.0  # a writer waits this long for readers before reporting who holds the lock
_POLL_S = 0.05
_LEGACY_STAGING = re.compile(r"[a-z0-9_]{8}")  # tempfile.mkdtemp's suffix, used by the previous writer


class GoldenError(ValueError):
    """A golden that cannot be used as it is: the CLI exits 2 and the message says how to fix it."""


class GoldenMissing(GoldenError, FileNotFoundError):
    """No golden where one was expected."""


class GoldenCorrupt(GoldenError):
    """A golden file missing, truncated, edited or unreadable, or a manifest of the wrong shape."""


class GoldenLocked(GoldenError):
    """Another process holds the golden's lock."""


class _FileSystem:
    """Each filesystem step of publish() and of recovery, one call per step: the fault-injection seam."""

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)
        os.chmod(path, 0o755)  # not left to the umask

    def write(self, path: Path, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def rmtree(self, path: Path) -> None:
        shutil.rmtree(path)

    def unlink(self, path: Path) -> None:
        path.unlink()


_fs = _FileSystem()


def _sibling(folder: Path, kind: str) -> Path:
    return folder.with_name(f".{folder.name}.{kind}")


def _leftovers(folder: Path) -> list[Path]:
    """Staging and swap folders of writers that died (or are working now: call under the lock)."""
    found = [p for p in (_sibling(folder, "new"), _sibling(folder, "old")) if os.path.lexists(p)]
    prefix = f".{folder.name}."
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder.parent):
            suffix = entry.name[len(prefix):]
            if entry.name.startswith(prefix) and _LEGACY_STAGING.fullmatch(suffix) and entry.is_dir(follow_symlinks=False):
                found.append(Path(entry.path))
    return found


def _recover(folder: Path) -> None:
    """Undo what a dead writer left (module docstring, states a-c). Call under the exclusive lock."""
    old = _sibling(folder, "old")
    if not os.path.lexists(folder) and old.is_dir() and not old.is_symlink():
        _fs.rename(old, folder)  # (b): the swap never finished, so the old golden still stands
        _fs.fsync_dir(folder.parent)
    for leftover in _leftovers(folder):
        if leftover.is_symlink() or not leftover.is_dir():
            _fs.unlink(leftover)
        else:
            _fs.rmtree(leftover)


def _holder(lock_path: Path) -> str:
    try:
        info = json.loads(lock_path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "a reader (no writer recorded in the lock file)"
    return f"pid {info.get('pid')} on {info.get('host')} (`{info.get('command')}`) since {info.get('since')}"


@contextlib.contextmanager
def _locked(folder: Path, *, shared: bool, wait_s: float):
    """Hold .<name>.lock (flock) shared or exclusive; GoldenLocked after wait_s, naming the holder.

    Yields False without locking where the lock file cannot be created (a read-only checkout:
    no writer can work there either)."""
    path = _sibling(folder, "lock")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            if shared and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                yield False
                return
            raise
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise GoldenLocked(
                    f"golden {folder} is locked by {_holder(path)}. Wait for it to finish and run again "
                    f"(a killed process releases its lock by itself; the lock file is {path})."
                ) from None
            time.sleep(_POLL_S)
            continue
        # The last holder removes the file: make sure the one we locked is still the one at the path.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        if not shared:
            info = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv),
                    "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
        yield True
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the last holder removes the lock file
            os.unlink(path)
        except (BlockingIOError, FileNotFoundError):
            pass
        finally:
            os.close(fd)


def _refuse_non_folder(folder: Path, fix: str) -> None:
    """A golden is a real folder: a swap of a link or a file would not be what a reviewer sees in git."""
    if folder.is_symlink():
        raise GoldenCorrupt(f"golden {folder} is a symlink (to {os.readlink(folder)}); the store keeps goldens as "
                            f"real folders. Remove the link (`rm {folder}`) and {fix}")
    if os.path.lexists(folder) and not folder.is_dir():
        raise GoldenCorrupt(f"golden {folder} is a file, not a folder. Remove it (`rm {folder}`) and {fix}")


def _is_content_name(name: str) -> bool:
    """A content file sits in the golden folder itself, is not hidden and is not the manifest."""
    return bool(name) and name != MANIFEST and not name.startswith(".") and name == os.path.basename(name)


def manifest_bytes(manifest: dict, files: dict[str, bytes]) -> bytes:
    """The manifest with the sha256 and size of every file, as the bytes publish() writes (sorted keys)."""
    listed = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in files.items()}
    return (json.dumps({**manifest, "files": listed}, indent=2, sort_keys=True) + "\n").encode()


def publish(folder: Path, files: dict[str, bytes], manifest: dict) -> Path:
    """Atomically replace the golden at `folder` with `files` + manifest.json (steps in the module docstring).

    The manifest gets "files": {name: {"sha256", "bytes"}}. Serialized by a lock (GoldenLocked names the
    holder); crash-safe; the same inputs give the same bytes; modes 0644 / 0755. On an error (disk full)
    the staging folder is removed and the previous golden stays as it was."""
    folder = Path(folder)
    bad = [name for name in files if not _is_content_name(name)]
    if bad:
        raise ValueError(f"golden file names {bad}: plain names only, not hidden, not {MANIFEST}")
    contents = {**files, MANIFEST: manifest_bytes(manifest, files)}
    folder.parent.mkdir(parents=True, exist_ok=True)
    new, old = _sibling(folder, "new"), _sibling(folder, "old")
    with _locked(folder, shared=False, wait_s=WRITE_WAIT_S):
        _recover(folder)
        _refuse_non_folder(folder, "run again.")
        try:
            _fs.mkdir(new)
            for name in sorted(contents):
                _fs.write(new / name, contents[name])
            _fs.fsync_dir(new)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        if os.path.lexists(folder):
            _fs.rename(folder, old)
            _fs.fsync_dir(folder.parent)
        _fs.rename(new, folder)
        _fs.fsync_dir(folder.parent)
        if os.path.lexists(old):
            _fs.rmtree(old)
    return folder


def corrupt(folder: Path, name: str, problem: str, regenerate: str) -> GoldenCorrupt:
    """The error for one bad file of a golden: which file, what is wrong, the command that rewrites it."""
    return GoldenCorrupt(f"golden file {folder / name} {problem}. Regenerate the golden with:\n  {regenerate}")


def _read_golden_file(folder: Path, name: str, regenerate: str) -> bytes:
    try:
        return (folder / name).read_bytes()
    except FileNotFoundError:
        raise corrupt(folder, name, "is missing", regenerate) from None
    except OSError as err:
        raise corrupt(folder, name, f"cannot be read ({err.strerror})", regenerate) from None


def _read_verified(folder: Path, regenerate: str) -> tuple[dict, dict[str, bytes]]:
    _refuse_non_folder(folder, f"regenerate the golden with:\n  {regenerate}")
    if not folder.is_dir():
        raise GoldenMissing(f"no golden at {folder}. Make one with:\n  {regenerate}")
    raw = _read_golden_file(folder, MANIFEST, regenerate)
    try:
        manifest = json.loads(raw)
    except ValueError as err:
        raise corrupt(folder, MANIFEST, f"is not valid JSON ({err})", regenerate) from None
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or not all(
        isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("bytes"), int)
        for entry in listed.values()
    ):
        raise corrupt(folder, MANIFEST, 'is not a golden manifest (a JSON object whose "files" maps each file '
                       'to its "sha256" and "bytes"; goldens written before the verified store lack it)', regenerate)
    files = {}
    for name, entry in sorted(listed.items()):
        if not _is_content_name(name):
            raise corrupt(folder, MANIFEST, f"lists a file outside the golden: {name!r}", regenerate)
        data = _read_golden_file(folder, name, regenerate)
        if len(data) != entry["bytes"]:
            raise corrupt(folder, name, f"has {len(data)} bytes, its manifest says {entry['bytes']} (truncated or "
                           "replaced)", regenerate)
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise corrupt(folder, name, "does not match the sha256 in its manifest (edited or damaged)", regenerate)
        files[name] = data
    return manifest, files


def read(folder: Path, regenerate: str) -> tuple[dict, dict[str, bytes]]:
    """Recover what a dead writer left if needed, then return the manifest and the verified file bytes.

    Raises GoldenMissing (no golden there) or GoldenCorrupt (naming the file, what is wrong and
    `regenerate`, the command that rewrites it); GoldenLocked if a writer holds the lock too long."""
    folder = Path(folder)
    if not folder.parent.is_dir():
        raise GoldenMissing(f"no golden at {folder} (no folder {folder.parent}). Make one with:\n  {regenerate}")
    with _locked(folder, shared=True, wait_s=READ_WAIT_S) as locked:
        if not locked or not _leftovers(folder):
            return _read_verified(folder, regenerate)
    with _locked(folder, shared=False, wait_s=READ_WAIT_S):
        _recover(folder)
        return _read_verified(folder, regenerate)
