"""The golden store: a kill at any step leaves the old or the new golden, contents verified, one writer.

Fault injection, not sleeping: a writer in a subprocess is killed with SIGKILL right before each
filesystem step of publish() in turn (and in the middle of each file write), then the store is read
and written again.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parity import store

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "python -m parity golden --model vit_tiny --data scenes"


def version(tag: str) -> tuple[dict[str, bytes], dict]:
    """Two distinguishable goldens ("old", "new"), content files of different sizes."""
    files = {"a.bin": hashlib.sha256(tag.encode()).digest() * 300, "b.json": json.dumps({"tag": tag}).encode()}
    return files, {"tag": tag}


def assert_holds(folder: Path, tag: str) -> None:
    manifest, files = store.read(folder, REGENERATE)
    expected_files, expected_manifest = version(tag)
    assert files == expected_files
    assert manifest["tag"] == expected_manifest["tag"]


def assert_no_leftovers(folder: Path) -> None:
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


def test_round_trip_records_checksums(tmp_path):
    folder = store.publish(tmp_path / "g", *version("old"))
    manifest, files = store.read(folder, REGENERATE)
    assert files == version("old")[0]
    assert manifest["files"]["a.bin"] == {"sha256": hashlib.sha256(files["a.bin"]).hexdigest(), "bytes": 9600}
    assert sorted(p.name for p in folder.iterdir()) == ["a.bin", "b.json", "manifest.json"]
    assert_no_leftovers(folder)


def test_same_inputs_give_same_bytes_and_normal_modes(tmp_path):
    old_umask = os.umask(0o077)  # a strict umask must not leak into the golden's modes
    try:
        first = store.publish(tmp_path / "one" / "g", *version("new"))
        second = store.publish(tmp_path / "two" / "g", *version("new"))
    finally:
        os.umask(old_umask)
    for name in ("a.bin", "b.json", "manifest.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
        assert (first / name).stat().st_mode & 0o777 == 0o644
    assert first.stat().st_mode & 0o777 == 0o755


def test_replacing_a_golden_keeps_no_trace_of_the_old(tmp_path):
    folder = store.publish(tmp_path / "g", *version("old"))
    store.publish(folder, {"only.bin": b"x"}, {"tag": "new"})
    manifest, files = store.read(folder, REGENERATE)
    assert files == {"only.bin": b"x"} and manifest["tag"] == "new"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "only.bin"]
    assert_no_leftovers(folder)


def test_missing_golden(tmp_path):
    with pytest.raises(store.GoldenMissing, match=REGENERATE) as err:
        store.read(tmp_path / "nothing", REGENERATE)
    assert isinstance(err.value, FileNotFoundError) and isinstance(err.value, store.GoldenError)
    with pytest.raises(store.GoldenMissing):
        store.read(tmp_path / "no-root" / "nothing", REGENERATE)


def _damage_cases():
    def truncate(folder):
        path = folder / "a.bin"
        path.write_bytes(path.read_bytes()[:100])

    def flip(folder):
        path = folder / "a.bin"
        data = bytearray(path.read_bytes())
        data[50] ^= 0x01
        path.write_bytes(bytes(data))

    def edit_manifest_listing(folder):
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["files"]["a.bin"]["sha256"] = "0" * 64
        (folder / "manifest.json").write_text(json.dumps(manifest))

    return {
        "truncated": (truncate, "a.bin", "has 100 bytes"),
        "flipped byte": (flip, "a.bin", "sha256"),
        "deleted file": (lambda f: (f / "b.json").unlink(), "b.json", "is missing"),
        "deleted manifest": (lambda f: (f / "manifest.json").unlink(), "manifest.json", "is missing"),
        "manifest a list": (lambda f: (f / "manifest.json").write_text("[]"), "manifest.json", "not a golden manifest"),
        "manifest not json": (lambda f: (f / "manifest.json").write_text("{"), "manifest.json", "not valid JSON"),
        "manifest without files": (lambda f: (f / "manifest.json").write_text('{"tag": 1}'), "manifest.json", "not a golden manifest"),
        "listing edited": (edit_manifest_listing, "a.bin", "sha256"),
    }


@pytest.mark.parametrize("case", list(_damage_cases()))
def test_damaged_golden_is_refused_naming_file_and_fix(tmp_path, case):
    damage, name, problem = _damage_cases()[case]
    folder = store.publish(tmp_path / "g", *version("old"))
    damage(folder)
    with pytest.raises(store.GoldenCorrupt) as err:
        store.read(folder, REGENERATE)
    message = str(err.value)
    assert str(folder / name) in message and problem in message and REGENERATE in message


def test_symlinked_or_file_golden_is_refused_and_left_alone(tmp_path):
    real = store.publish(tmp_path / "real", *version("old"))
    link = tmp_path / "g"
    link.symlink_to(real)
    for call in (lambda: store.read(link, REGENERATE), lambda: store.publish(link, *version("new"))):
        with pytest.raises(store.GoldenCorrupt, match=f"is a symlink.*rm {link}"):
            call()
    assert link.is_symlink() and (real / "b.json").read_bytes() == version("old")[0]["b.json"]
    link.unlink()
    link.write_text("not a folder")
    with pytest.raises(store.GoldenCorrupt, match="is a file, not a folder"):
        store.read(link, REGENERATE)
    link.unlink()  # the fix the message names: afterwards the store works again
    store.publish(link, *version("new"))
    assert_holds(link, "new")


def test_disk_full_keeps_the_old_golden_and_no_leftovers(tmp_path, monkeypatch):
    folder = store.publish(tmp_path / "g", *version("old"))
    real_write = store._fs.write

    def full(path, data):
        real_write(path, data[: len(data) // 2])  # a torn file, then the error
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store._fs, "write", full)
    with pytest.raises(OSError, match="No space left"):
        store.publish(folder, *version("new"))
    monkeypatch.undo()
    assert_holds(folder, "old")
    assert_no_leftovers(folder)


# A writer that dies with SIGKILL before filesystem step `kill_at` of publish() (0: never); with
# `torn`, a file write at that step first writes half its bytes. It prints the steps it made.
WRITER = textwrap.dedent("""
    import hashlib, json, os, signal, sys
    from pathlib import Path
    from parity import store

    folder, kill_at, torn, tag = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "torn", sys.argv[4]
    inner, steps = store._fs, []

    class Killing:
        def __getattr__(self, name):
            def call(*args):
                steps.append(name)
                if len(steps) == kill_at:
                    if torn and name == "write":
                        inner.write(args[0], args[1][: len(args[1]) // 2])
                    os.kill(os.getpid(), signal.SIGKILL)
                return getattr(inner, name)(*args)
            return call

    store._fs = Killing()
    store.publish(folder, *version(tag))
    print(json.dumps(steps))
""")


def run_writer(folder: Path, kill_at: int, torn: bool = False, tag: str = "new") -> subprocess.CompletedProcess:
    script = inspect.getsource(version) + WRITER
    return subprocess.run([sys.executable, "-c", script, str(folder), str(kill_at), "torn" if torn else "whole", tag],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def publish_steps(tmp_path: Path) -> list[str]:
    """The filesystem steps of publish() over an existing golden, counted by a writer that is not killed."""
    folder = store.publish(tmp_path / "count" / "g", *version("old"))
    done = run_writer(folder, kill_at=0)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_kill_at_every_step_leaves_old_or_new_golden(tmp_path):
    steps = publish_steps(tmp_path)
    assert steps.count("write") == 3 and steps.count("rename") == 2  # a.bin, b.json, manifest.json; the swap
    outcomes = []
    for kill_at, step in enumerate(steps, start=1):
        for torn in (False, True) if step == "write" else (False,):
            folder = store.publish(tmp_path / f"k{kill_at}{torn}" / "g", *version("old"))
            killed = run_writer(folder, kill_at, torn)
            assert killed.returncode == -signal.SIGKILL, killed.stderr
            _, files = store.read(folder, REGENERATE)  # recovers, then verifies every byte
            outcomes.append(next(tag for tag in ("old", "new") if files == version(tag)[0]))
            assert_no_leftovers(folder)  # the read recovered what the dead writer left
            store.publish(folder, *version("next"))
            assert_holds(folder, "next")
            assert_no_leftovers(folder)
    # Both outcomes happen: a kill before the swap keeps the old golden, one after it the new.
    assert outcomes[0] == "old" and outcomes[-1] == "new"


def test_next_writer_recovers_a_dead_writers_leftovers(tmp_path):
    """No read in between: the next publish() recovers by itself (killed between the two renames)."""
    steps = publish_steps(tmp_path)
    folder = store.publish(tmp_path / "store" / "g", *version("old"))
    kill_at = steps.index("rename") + 2  # after the first rename: only .<name>.old holds the golden
    assert run_writer(folder, kill_at).returncode == -signal.SIGKILL
    assert not folder.exists() and (folder.parent / ".g.old").is_dir()
    store.publish(folder, *version("next"))
    assert_holds(folder, "next")
    assert_no_leftovers(folder)


def test_previous_writers_staging_folders_are_removed(tmp_path):
    folder = store.publish(tmp_path / "g", *version("old"))
    legacy = tmp_path / ".g.k2x_9qaz"  # tempfile.mkdtemp's name, as the previous writer left it
    legacy.mkdir(mode=0o700)
    (legacy / "manifest.json").write_text("{}")
    assert_holds(folder, "old")
    assert_no_leftovers(folder)


HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from parity import store
    with store._locked(Path(sys.argv[1]), shared=False, wait_s=0):
        print("locked", flush=True)
        sys.stdin.readline()
""")


def test_second_writer_is_refused_naming_the_holder(tmp_path, monkeypatch):
    folder = store.publish(tmp_path / "g", *version("old"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), "golden-writer-marker"], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        monkeypatch.setattr(store, "WRITE_WAIT_S", 0.0)
        with pytest.raises(store.GoldenLocked, match=rf"pid {holder.pid} on .*golden-writer-marker.* since "):
            store.publish(folder, *version("new"))
    finally:
        holder.communicate("\n", timeout=30)
    assert_holds(folder, "old")
    store.publish(folder, *version("new"))  # the lock went with its holder
    assert_holds(folder, "new")
    assert_no_leftovers(folder)
