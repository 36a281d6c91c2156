"""DAVIS-layout folders (parity/golden/davis.py) for the video task: the reader on tiny folders built
here (two videos of 3 frames, 48 x 64, palette annotations with objects 1 and 2 and a void band of
255), each refusal naming its file, and the gate end to end on `--data davis` under SAMFAST_DATA: a
golden, then fp32 checked against it (seeded sam2.1_hiera_nano at input 256, 6 tracking steps a run).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from parity.cli import main
from parity.golden.coco_format import DataError
from parity.golden.davis import read_davis
from parity.golden.settings import DataNotFoundError
from parity.golden.videos import clip_fingerprint
from parity.tasks.video import golden as video_golden

HEIGHT, WIDTH, FRAMES = 48, 64, 3
VIDEOS = ("bear", "car")  # written in reverse order below: the reader must sort
VOID_ROWS = slice(0, 4)  # a band of 255 across the top of every annotation
PALETTE = [0, 0, 0, 128, 0, 0, 0, 128, 0] + [0, 0, 0] * 252 + [224, 224, 192]  # DAVIS-like: 255 is the void colour


def object_ids(t: int) -> np.ndarray:
    """Object 1 moves right 4 pixels a frame, object 2 stays; the void band overlaps object 1's top."""
    ids = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    ids[2:20, 5 + 4 * t : 21 + 4 * t] = 1
    ids[28:40, 30:50] = 2
    ids[VOID_ROWS] = 255
    return ids


def palette_png(ids: np.ndarray) -> Image.Image:
    image = Image.frombytes("P", (ids.shape[1], ids.shape[0]), ids.tobytes())
    image.putpalette(PALETTE)
    return image


def make_davis(root, *, level: tuple[str, ...] = ("480p",), videos=VIDEOS):
    for v, name in enumerate(reversed(videos)):
        frame_dir = root.joinpath("JPEGImages", *level, name)
        annotation_dir = root.joinpath("Annotations", *level, name)
        frame_dir.mkdir(parents=True)
        annotation_dir.mkdir(parents=True)
        for t in reversed(range(FRAMES)):
            frame = np.full((HEIGHT, WIDTH, 3), 40 + 60 * t + 10 * v, dtype=np.uint8)  # brightness says the frame
            frame[object_ids(t) == 1] = (200, 30, 30)
            Image.fromarray(frame).save(frame_dir / f"{t:05d}.jpg", quality=95)
            palette_png(object_ids(t)).save(annotation_dir / f"{t:05d}.png")
    return root


@pytest.mark.parametrize("level", [("480p",), ()], ids=["480p", "no-resolution-level"])
def test_reader_gives_objects_masks_and_order(tmp_path, level):
    clips = read_davis(make_davis(tmp_path, level=level))
    assert [c.name for c in clips] == list(VIDEOS) and [c.video_id for c in clips] == [1, 2]
    clip = clips[0]
    assert clip.frames.shape == (FRAMES, HEIGHT, WIDTH, 3) and clip.frames.dtype == np.uint8
    assert clip.masks.shape == (2, FRAMES, HEIGHT, WIDTH) and clip.masks.dtype == bool
    assert clip.davis_ids == (1, 2) and clip.object_ids == [1, 2]
    brightness = clip.frames[:, -1, -1].mean(axis=1)  # a background pixel
    assert np.all(np.diff(brightness) > 40)  # frames in name order, though written last first
    for t in range(FRAMES):
        for obj in (1, 2):
            expected = object_ids(t) == obj
            assert np.array_equal(clip.masks[obj - 1, t], expected)
    assert not clip.masks[:, :, VOID_ROWS].any()  # void (255) is background, never an object


def test_first_videos_and_frames_and_grayscale_annotations(tmp_path):
    make_davis(tmp_path)
    grayscale = tmp_path / "Annotations/480p/bear/00000.png"
    Image.fromarray(object_ids(0)).save(grayscale)  # mode L: the same ids
    [clip] = read_davis(tmp_path, videos=1, max_frames=2)
    assert clip.name == "bear" and clip.masks.shape == (2, 2, HEIGHT, WIDTH)
    assert np.array_equal(clip.masks[0, 0], object_ids(0) == 1)


def test_objects_are_the_ids_present_in_increasing_order(tmp_path):
    make_davis(tmp_path, videos=("bear",))
    relabel = np.arange(256, dtype=np.uint8)
    relabel[1], relabel[2] = 7, 3  # ids 7 and 3 instead of 1 and 2: masks in id order, tracker ids 1..K
    for t in range(FRAMES):
        palette_png(relabel[object_ids(t)]).save(tmp_path / f"Annotations/480p/bear/{t:05d}.png")
    [clip] = read_davis(tmp_path)
    assert clip.davis_ids == (3, 7) and clip.object_ids == [1, 2]
    assert np.array_equal(clip.masks[0, 0], object_ids(0) == 2)


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def remove_tree(path):
    for child in sorted(path.rglob("*"), reverse=True):
        child.unlink() if child.is_file() else child.rmdir()
    path.rmdir()


# (what breaks the folder, the path the refusal must name, the error class)
REFUSALS = {
    "no JPEGImages": (lambda r: remove_tree(r / "JPEGImages"), "JPEGImages", DataNotFoundError),
    "no Annotations": (lambda r: remove_tree(r / "Annotations"), "Annotations", DataNotFoundError),
    "no annotations of a video": (lambda r: remove_tree(r / "Annotations/480p/car"), "Annotations/480p/car",
                                  DataNotFoundError),
    "video without frames": (lambda r: (r / "JPEGImages/480p/apple").mkdir(), "JPEGImages/480p/apple", DataError),
    "frame without annotation": (lambda r: (r / "Annotations/480p/car/00001.png").unlink(),
                                 "Annotations/480p/car/00001.png", DataError),
    "RGB annotation": (lambda r: Image.new("RGB", (WIDTH, HEIGHT)).save(r / "Annotations/480p/bear/00002.png"),
                       "Annotations/480p/bear/00002.png", DataError),
    "annotation of another size": (lambda r: palette_png(np.ones((HEIGHT, WIDTH + 1), np.uint8)).save(
        r / "Annotations/480p/car/00000.png"), "Annotations/480p/car/00000.png", DataError),
    "truncated frame": (lambda r: truncate(r / "JPEGImages/480p/bear/00001.jpg"), "JPEGImages/480p/bear/00001.jpg",
                        DataError),
    "truncated annotation": (lambda r: truncate(r / "Annotations/480p/bear/00001.png"),
                             "Annotations/480p/bear/00001.png", DataError),
    "frame of another size": (lambda r: Image.new("RGB", (WIDTH, HEIGHT + 2)).save(r / "JPEGImages/480p/car/00002.jpg"),
                              "JPEGImages/480p/car/00002.jpg", DataError),
    "no object": (lambda r: [palette_png(np.full((HEIGHT, WIDTH), 255, np.uint8)).save(p)
                             for p in (r / "Annotations/480p/car").glob("*.png")], "Annotations/480p/car", DataError),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_folders_are_refused_naming_the_file(tmp_path, case):
    breaks, named, error = REFUSALS[case]
    breaks(make_davis(tmp_path))
    with pytest.raises(error) as caught:
        read_davis(tmp_path)
    assert str(tmp_path / named) in str(caught.value)


def test_more_videos_than_the_folder_holds_are_refused(tmp_path):
    with pytest.raises(DataError, match="pass --videos 2 or fewer"):
        read_davis(make_davis(tmp_path), videos=3)


def test_gate_on_a_davis_folder_under_samfast_data(tmp_path, monkeypatch, capsys):
    """Golden, then fp32 against it (passes, every figure exact); the manifest holds the clips' identity,
    so a golden of another folder is refused (exit 2). ~20 s on 2 shared CPU cores."""
    make_davis(tmp_path / "data" / "davis")
    monkeypatch.setenv("SAMFAST_DATA", str(tmp_path / "data"))
    args = ["--task", "video", "--model", "sam2.1_hiera_nano", "--seed", "0", "--data", "davis", "--videos", "1",
            "--video-frames", "3", "--video-input-size", "256", "--device", "cpu"]
    assert main(["golden", *args, "--golden-root", str(tmp_path / "golden")]) == 0
    [folder] = (tmp_path / "golden").iterdir()
    assert "davis-videos1x3" in folder.name
    manifest, [outputs] = video_golden.read(folder, "regenerate")
    assert manifest["dataset"]["reader"] == "davis-v1" and manifest["dataset"]["data"] == "davis"
    assert manifest["dataset_fingerprint"] == clip_fingerprint(read_davis(tmp_path / "data" / "davis", 1, 3))
    assert outputs.masks.shape == (2, 3, HEIGHT, WIDTH)

    check = ["check", *args, "--golden", str(folder), "--stages", "fp32", "--report-dir", str(tmp_path / "reports")]
    assert main(check) == 0
    report = json.loads((tmp_path / "reports/video/report.json").read_text())
    assert report["verdict"] == "PASS"
    capsys.readouterr()

    # the same golden against another folder's clips: refused, with the command that regenerates it
    frame = tmp_path / "data/davis/JPEGImages/480p/bear/00000.jpg"
    Image.fromarray(np.zeros((HEIGHT, WIDTH, 3), np.uint8)).save(frame)
    assert main(check) == 2
    assert "--data davis" in capsys.readouterr().err
