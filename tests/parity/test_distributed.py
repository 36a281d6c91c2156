"""torchrun with 2 gloo ranks on the CPU: the same golden as one process, resumed after a kill,
and a failing rank that stops the run cleanly; plus the shard files on their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from parity.golden.data import load_coco, load_dataset
from parity.golden.distributed import KILL_AFTER_ENV, Ranks, WorkFolder, encode_record, read_records
from parity.golden.scenes import generate_scenes
from parity.tasks.point.runner import make_golden
from parity.tasks.source import ModelSource
from tests.child_env import child_env

REPO = Path(__file__).resolve().parents[2]
IMAGES, ANNOTATIONS_PER_IMAGE = 3, 2  # 3 batches of 1 image: rank 0 takes batches 0 and 2, rank 1 batch 1
TIMEOUT_S = 300  # a hang fails the test instead of the suite


def _torchrun(args: list[str], env: dict | None = None, *, through_nproc: bool = False) -> subprocess.CompletedProcess:
    """2 ranks: torchrun itself, or `python -m parity ... --nproc 2` (which starts torchrun; nox's way)."""
    command = ([sys.executable, "-m", "parity", *args, "--nproc", "2"] if through_nproc else
               [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "parity", *args])
    # One thread per process, as in the single-process golden below: CPU GEMMs may sum in another
    # order with another thread count, and this test is about ranks, not threads.
    env = child_env(OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def _write_coco(folder: Path, annotated: list[int], unreadable: int | None = None) -> Path:
    """Generated scenes on disk as a COCO folder, with the first annotations of the images in
    `annotated` only (fewer prompts keep the CPU test quick) and maybe one file that is no image."""
    coco, images = generate_scenes(IMAGES, seed=0)
    coco["annotations"] = [a for image_id in annotated
                           for a in [a for a in coco["annotations"] if a["image_id"] == image_id][:ANNOTATIONS_PER_IMAGE]]
    (folder / "images").mkdir(parents=True)
    (folder / "annotations").mkdir()
    (folder / "annotations" / "scenes.json").write_text(json.dumps(coco))
    for image_id, (name, pixels) in enumerate(images.items(), start=1):
        if image_id == unreadable:
            (folder / "images" / name).write_bytes(b"not a png")
        else:
            Image.fromarray(pixels).save(folder / "images" / name)
    return folder


def _args(data: Path, golden_root: Path) -> list[str]:
    return ["golden", "--seed", "0", "--data", str(data), "--batch-size", "1", "--device", "cpu", "--golden-root", str(golden_root)]


def _golden_in(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    return folder


def _contents(folder: Path) -> dict:
    """Every file's bytes (the store writes reproducible bytes: gzip and zip without time stamps)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def scenes_folder(tmp_path_factory):
    return _write_coco(tmp_path_factory.mktemp("data") / "scenes3", annotated=list(range(1, IMAGES + 1)))


@pytest.fixture(scope="module")
def one_process_golden(scenes_folder, tmp_path_factory):
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dataset = load_coco(scenes_folder / "images", scenes_folder / "annotations" / "scenes.json", name=scenes_folder.name)
        return make_golden(ModelSource("vit_tiny"), dataset, device="cpu", batch_size=1, root=tmp_path_factory.mktemp("one"))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow(reason="torchrun starts two ranks, each importing torch and building the model, after the one-process golden")
def test_two_ranks_write_the_golden_of_one_process(scenes_folder, one_process_golden, tmp_path):
    run = _torchrun(_args(scenes_folder, tmp_path), through_nproc=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "torch.distributed.run --standalone --nproc-per-node 2" in run.stderr
    assert "2 ranks share 3 batches" in run.stderr
    assert _contents(_golden_in(tmp_path)) == _contents(one_process_golden)
    assert [p.name for p in tmp_path.iterdir()] == [one_process_golden.name]  # the work folder is gone


@pytest.mark.slow(reason="torchrun twice, killed then resumed, two ranks each importing torch and building the model")
def test_killed_run_resumes_to_the_same_golden(scenes_folder, one_process_golden, tmp_path):
    # Rank 1 dies right after recording batch 1; rank 0 cannot pass that round's boundary without
    # it, so batch 2 is always left for the re-run.
    killed = _torchrun(_args(scenes_folder, tmp_path), {KILL_AFTER_ENV: "1:1"})
    assert killed.returncode != 0
    (work,) = tmp_path.iterdir()  # no golden, only the finished batches
    assert work.name == f".{one_process_golden.name}.work"
    assert len(read_records(work / "rank1.records")[0]) == 1
    resumed = _torchrun(_args(scenes_folder, tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "already done" in resumed.stderr and "resuming" in resumed.stderr
    assert _contents(_golden_in(tmp_path)) == _contents(one_process_golden)
    assert not work.exists()


def test_rank_with_an_unreadable_image_stops_the_run(tmp_path):
    """Image 2 (rank 1's batch) is not an image: both ranks stop at the batch boundary, exit 2
    (bad input), the message names the rank and the image, and the old golden stays. (Only image 2
    is annotated, so rank 0's image 1 costs no model time.)"""
    data = _write_coco(tmp_path / "data", annotated=[2], unreadable=2)
    old = tmp_path / "golden" / "vit_tiny-synthetic-seed0-data"
    old.mkdir(parents=True)
    (old / "manifest.json").write_text('{"old": true}\n')

    run = _torchrun(_args(data, tmp_path / "golden"))
    assert run.returncode != 0
    assert "error: rank 1 of 2 failed on image id 2 (scene_0002.png): DataError" in run.stderr
    assert "scene_0002.png is not a readable image (UnidentifiedImageError" in run.stderr
    assert "exitcode  : 2" in run.stderr  # torchrun's summary of the ranks: bad input
    assert [p.name for p in old.iterdir()] == ["manifest.json"]
    assert (old / "manifest.json").read_text() == '{"old": true}\n'


def _payload(batch: int, body: bytes = b"") -> bytes:
    return json.dumps({"batch": batch}).encode() + b"\n" + body


def test_shard_file_ignores_a_torn_or_corrupt_tail(tmp_path):
    shard = tmp_path / "rank0.records"
    records = [encode_record(_payload(k, bytes(100))) for k in range(3)]
    shard.write_bytes(records[0] + records[1] + records[2][:-7])  # killed while writing the third
    assert read_records(shard) == ([_payload(0, bytes(100)), _payload(1, bytes(100))], len(records[0]) + len(records[1]))
    flipped = bytearray(records[0] + records[1])
    flipped[-1] ^= 1  # a changed byte in the second record's payload fails its checksum
    shard.write_bytes(bytes(flipped))
    assert read_records(shard)[0] == [_payload(0, bytes(100))]


def test_work_folder_resumes_its_own_run_only(tmp_path, capsys):
    folder = tmp_path / ".g.work"
    first = WorkFolder(folder, {"batch_size": 2}, Ranks())
    assert first.open() == {}
    first.append(_payload(0))
    with open(folder / "rank0.records", "ab") as f:
        f.write(encode_record(_payload(1))[:-3])  # a torn record left by a kill
    again = WorkFolder(folder, {"batch_size": 2}, Ranks())
    assert again.open() == {0: _payload(0)}
    again.append(_payload(1))  # appended after the torn tail was cut: readable
    assert WorkFolder(folder, {"batch_size": 2}, Ranks()).open() == {0: _payload(0), 1: _payload(1)}
    other = WorkFolder(folder, {"batch_size": 4}, Ranks())
    assert other.open() == {}
    out = capsys.readouterr().out
    assert "another run" in out and "starting over" in out


def test_scenes_count_extends_the_embedded_scenes():
    embedded, larger = load_dataset("scenes", limit=2), load_dataset("scenes:17", limit=2)
    assert larger.name == "scenes17" and embedded.name == "scenes"
    for a, b in zip(embedded.samples, larger.samples):
        np.testing.assert_array_equal(a.image, b.image)
    with pytest.raises(ValueError, match="positive integer, e.g. scenes:1000"):
        load_dataset("scenes:many")
