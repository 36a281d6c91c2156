"""python -m samfast.amg end to end in a subprocess: PNG masks + metadata.csv, COCO RLE json, clear input errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from parity.golden.scenes import generate_scenes
from samfast.amg.__main__ import main as amg_main

REPO = Path(__file__).resolve().parents[2]
# a grid small enough for the CPU; thresholds low enough that masks come out
FAST = ["--model", "vit_tiny", "--checkpoint", "trained", "--device", "cpu", "--points-per-side", "2",
        "--pred-iou-thresh", "0", "--stability-score-thresh", "0"]


def run_amg(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "samfast.amg", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    _, scenes = generate_scenes(2, seed=1)
    for name, image in scenes.items():
        Image.fromarray(image).save(folder / name)
    return folder


def test_writes_png_masks_and_metadata_then_rle_json(image_dir, tmp_path):
    out = tmp_path / "masks"
    done = run_amg(*FAST, "--input", image_dir, "--output", out)
    assert done.returncode == 0, done.stderr
    for image_path in sorted(image_dir.iterdir()):
        rows = (out / image_path.stem / "metadata.csv").read_text().splitlines()
        assert rows[0].startswith("id,area,bbox_x0") and len(rows) > 1
        first = np.array(Image.open(out / image_path.stem / "0.png")) > 0
        assert first.shape == np.array(Image.open(image_path)).shape[:2]
        assert int(rows[1].split(",")[1]) == first.sum()  # the csv's area is the PNG's

    rle_out = tmp_path / "rle"
    done = run_amg(*FAST, "--input", image_dir / "scene_0001.png", "--output", rle_out, "--convert-to-rle")
    assert done.returncode == 0, done.stderr
    records = json.loads((rle_out / "scene_0001.json").read_text())
    decoded = mask_utils.decode({"size": records[0]["segmentation"]["size"], "counts": records[0]["segmentation"]["counts"].encode()})
    png = np.array(Image.open(out / "scene_0001" / "0.png")) > 0
    assert decoded.sum() == records[0]["area"] > 0
    np.testing.assert_array_equal(decoded > 0, png)  # the same mask in both layouts


def test_input_errors_exit_2_with_one_line(image_dir, tmp_path, capsys):
    """In-process (main(argv)): the same code path as the subprocess, without four torch imports."""
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bad.png").write_bytes(b"not a png")
    twins = tmp_path / "twins"
    twins.mkdir()
    Image.new("RGB", (8, 8)).save(twins / "a.jpg")
    Image.new("RGB", (8, 8)).save(twins / "a.png")
    existing = tmp_path / "existing"
    existing.mkdir()
    cases = [
        (tmp_path / "missing.png", tmp_path / "o1", [], "does not exist"),
        (empty, tmp_path / "o2", [], "holds no images"),
        (broken, tmp_path / "o3", [], "bad.png is not a readable image"),
        (twins, tmp_path / "o4", [], "holds a.jpg and a.png, whose outputs would both be named 'a'"),
        (image_dir, tmp_path / "o5", ["--device", "gpu"], "--device 'gpu' is not a device"),
        (image_dir, existing, [], "already exists"),
    ]
    for source, out, extra, message in cases:
        assert amg_main([*FAST, "--input", str(source), "--output", str(out), *extra]) == 2
        stderr = capsys.readouterr().err
        errors = [line for line in stderr.splitlines() if line.startswith("error: ")]  # tqdm's bar shares stderr
        assert len(errors) == 1 and message in errors[0] and "Traceback" not in stderr, stderr
    assert not any(existing.iterdir()), "wrote into an output folder it did not create"
