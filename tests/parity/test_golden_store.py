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

from parity.golden import store

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


@pytest.mark.parametrize("name", ["manifest.json", ".hidden", "sub/file", "../escape", ""])
def test_file_names_outside_the_golden_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="plain names only"):
        store.publish(tmp_path / "g", {name: b"x"}, {})
    assert not (tmp_path / "g").exists()


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

    def list_outside(folder):
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["files"]["../escape"] = manifest["files"]["a.bin"]
        (folder / "manifest.json").write_text(json.dumps(manifest))

    return {
        "truncated": (truncate, "a.bin", "has 100 bytes"),
        "listing outside the folder": (list_outside, "manifest.json", "lists a file outside the golden: '../escape'"),
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
    from parity.golden import store

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
    from parity.golden import store
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


# --- point goldens (parity/golden.py) through the gate's command line: bad goldens exit 2 --------

def _gate_golden():
    """vit_tiny trained on one scene: real masks, a few seconds on the CPU."""
    from parity.golden.data import load_dataset
    from parity.tasks.source import ModelSource
    from samfast.checkpoint import resolve_checkpoint

    return ModelSource("vit_tiny", resolve_checkpoint("trained")), load_dataset("scenes", limit=1)


@pytest.fixture(scope="module")
def small_golden(tmp_path_factory) -> Path:
    from parity.tasks.point.runner import make_golden

    source, dataset = _gate_golden()
    return make_golden(source, dataset, device="cpu", root=tmp_path_factory.mktemp("golden"))


def parity_cli(argv: list[str], capsys) -> tuple[int, str]:
    """`python -m parity ARGV` in this process (parity.__main__ runs cli.main): exit code and stderr."""
    from parity.cli import main

    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse refuses bad arguments itself (one line, exit 2)
        code = exit_.code
    return code, capsys.readouterr().err


def check_args(golden: Path, tmp_path: Path) -> list[str]:
    return ["check", "--model", "vit_tiny", "--checkpoint", "trained", "--data", "scenes", "--limit", "1",
            "--device", "cpu", "--stages", "fp32", "--golden", str(golden), "--report-dir", str(tmp_path / "report")]


def _rewrite(folder: Path, change) -> None:
    """Re-publish the golden's outputs after `change(outputs)`: checksums valid, contents bad."""
    from parity.tasks.point import golden as point_golden

    manifest, outputs = point_golden.read_golden(folder)
    change(outputs)
    manifest = {k: v for k, v in manifest.items() if k != "files"}
    point_golden.write_golden(folder, outputs, manifest)


def _edit_scores(folder: Path) -> None:
    import gzip

    path = folder / "predictions.json.gz"
    records = json.loads(gzip.decompress(path.read_bytes()))
    records[0]["scores"][0] += 0.25
    path.write_bytes(gzip.compress(json.dumps(records).encode()))


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage_lzma_stream(folder: Path) -> None:
    """A byte of logits.npz's first compressed stream flipped, the manifest re-signed: only the decoder can tell."""
    path = folder / "logits.npz"
    data = bytearray(path.read_bytes())
    data[60] ^= 0xFF  # past the first entry's zip header (30 bytes), name (11) and LZMA properties (9)
    path.write_bytes(bytes(data))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["logits.npz"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _without_key(folder: Path, key: str) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest[key]
    path.write_text(json.dumps(manifest))


GOLDEN_DAMAGE = {
    "truncated predictions": (lambda f: (f / "predictions.json.gz").write_bytes((f / "predictions.json.gz").read_bytes()[:99]),
                              "predictions.json.gz", "has 99 bytes"),
    "flipped byte in logits": (lambda f: _flip_byte(f / "logits.npz"), "logits.npz", "sha256"),
    "deleted logits": (lambda f: (f / "logits.npz").unlink(), "logits.npz", "is missing"),
    "logits that no longer decompress": (_damage_lzma_stream, "logits.npz", "cannot be read as an npz"),
    "manifest a list": (lambda f: (f / "manifest.json").write_text("[1, 2]"), "manifest.json", "not a golden manifest"),
    "manifest without model_type": (lambda f: _without_key(f, "model_type"), "manifest.json", "lacks model_type"),
    "edited scores": (_edit_scores, "predictions.json.gz", "its manifest"),
    "logits without rows": (lambda f: _rewrite(f, lambda o: o.logits.clear()), "logits.npz", "no rows"),
    "logits of no record": (lambda f: _rewrite(f, lambda o: o.logits.update({999_999: o.logits.popitem()[1]})),
                            "logits.npz", "matching no record"),
}


@pytest.mark.parametrize("case", list(GOLDEN_DAMAGE))
def test_damaged_golden_exits_2_naming_file_and_fix(small_golden, tmp_path, capsys, case):
    import shutil

    damage, name, problem = GOLDEN_DAMAGE[case]
    golden = tmp_path / small_golden.name
    shutil.copytree(small_golden, golden)
    damage(golden)
    code, err = parity_cli(check_args(golden, tmp_path), capsys)
    assert code == 2, err
    assert str(golden / name) in err and problem in err
    assert "python -m parity golden --model vit_tiny --checkpoint" in err and "--data scenes --limit 1" in err


def test_sound_golden_passes_through_the_same_command(small_golden, tmp_path, capsys):
    """The control of the damage cases above: the undamaged golden exits 0 with the same arguments."""
    code, err = parity_cli(check_args(small_golden, tmp_path), capsys)
    assert code == 0, err


def test_exit_2_through_python_m_parity(small_golden, tmp_path):
    import shutil

    golden = tmp_path / small_golden.name
    shutil.copytree(small_golden, golden)
    (golden / "predictions.json.gz").write_bytes(b"\x1f\x8b truncated")
    done = subprocess.run([sys.executable, "-m", "parity", *check_args(golden, tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr
    assert str(golden / "predictions.json.gz") in done.stderr and "Traceback" not in done.stderr


def test_regenerating_gives_identical_bytes_and_normal_modes(small_golden, tmp_path):
    from parity.tasks.point.runner import make_golden

    source, dataset = _gate_golden()
    again = make_golden(source, dataset, device="cpu", root=tmp_path)
    names = sorted(p.name for p in small_golden.iterdir())
    assert names == ["logits.npz", "manifest.json", "predictions.json.gz"]
    for name in names:
        assert (again / name).read_bytes() == (small_golden / name).read_bytes(), name
        assert (again / name).stat().st_mode & 0o777 == 0o644
    assert again.stat().st_mode & 0o777 == 0o755


def test_batch_size_below_one_is_refused_and_old_golden_untouched(small_golden, capsys):
    before = {p.name: p.read_bytes() for p in small_golden.iterdir()}
    code, err = parity_cli(["golden", "--model", "vit_tiny", "--checkpoint", "trained", "--data", "scenes", "--limit", "1",
                            "--device", "cpu", "--batch-size", "-1", "--golden-root", str(small_golden.parent)], capsys)
    assert code == 2 and "--batch-size: must be at least 1, got -1" in err
    assert {p.name: p.read_bytes() for p in small_golden.iterdir()} == before


def test_crowd_only_data_is_refused(tmp_path, capsys):
    from PIL import Image

    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    crowd = {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 1, "area": 64.0, "bbox": [0, 0, 8, 8],
             "segmentation": [[0, 0, 8, 0, 8, 8, 0, 8]]}
    (tmp_path / "ann.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.png", "width": 32, "height": 32}], "annotations": [crowd],
        "categories": [{"id": 1, "name": "thing"}]}))
    code, err = parity_cli(["golden", "--model", "vit_tiny", "--coco-root", str(tmp_path), "--ann-file", str(tmp_path / "ann.json"),
                            "--device", "cpu", "--golden-root", str(tmp_path / "golden")], capsys)
    assert code == 2 and "no annotations left after filtering (1 crowd" in err, err
    assert not (tmp_path / "golden").exists() or not any((tmp_path / "golden").iterdir())


def test_nan_weights_are_refused_naming_the_first_annotation(tmp_path, capsys):
    import torch

    import samfast

    state = samfast.synthetic_state_dict("vit_tiny", seed=0)
    for key in state:
        if key.startswith("mask_decoder.iou_prediction_head."):
            state[key] = torch.full_like(state[key], float("nan"))
    torch.save(state, tmp_path / "nan.pth")
    _, dataset = _gate_golden()
    first = dataset.samples[0].annotations[0].ann_id
    code, err = parity_cli(["golden", "--model", "vit_tiny", "--checkpoint", str(tmp_path / "nan.pth"), "--data", "scenes",
                            "--limit", "1", "--device", "cpu", "--golden-root", str(tmp_path / "golden")], capsys)
    assert code == 2 and f"annotation {first} " in err and "non-finite" in err, err
    assert not (tmp_path / "golden").exists() or not any((tmp_path / "golden").iterdir())
