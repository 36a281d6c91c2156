"""Every bad input gets a clear error (docs/errors.md): the predictor, checkpoints, the COCO loader and the CLI.

Each case asserts the error's type (a project error the CLI maps to exit 2) and that its message
names the value, the file or the item. CLI cases run main() in-process (cheap); a few run as
`python -m parity` subprocesses, all at once, to show the whole path prints one line and no traceback.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import samfast
from parity import cli
from parity.golden.data import DataError, load_coco
from samfast import CheckpointError, InputError, Prompts
from tests.child_env import child_env

REPO = Path(__file__).resolve().parents[2]


# --- predictor -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def predictor():
    return samfast.SamPredictor(samfast.build_sam("vit_tiny", device="cpu"))


@pytest.fixture(scope="module")
def image_set(predictor):
    """The predictor with one 40x60 image embedded (one encoder pass for the predict tests)."""
    predictor.set_image(_image())
    return predictor


def _image(h=40, w=60):
    return np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _points(coords, labels):
    return Prompts(point_coords=np.array(coords, dtype=float), point_labels=np.array(labels))


@pytest.mark.parametrize("label", [7, -5, 0.7, -1, 2])
def test_labels_outside_0_and_1_name_the_value(predictor, label):
    with pytest.raises(InputError, match=rf"prompts\[0\] point label {label:g} is not 0 \(background\) or 1"):
        predictor.predict_batch([_image()], [_points([[[5, 5]]], [[label]])])


def test_labels_through_predict(image_set):
    predictor = image_set
    with pytest.raises(InputError, match="point label 0.7 is not 0"):
        predictor.predict(point_coords=np.array([[5, 5]]), point_labels=np.array([0.7]))
    masks, iou, _ = predictor.predict(point_coords=np.array([[5, 5]]), point_labels=np.array([1.0]))
    assert masks.shape == (3, 40, 60) and iou.shape == (3,)


def test_n_by_2_points_are_refused_naming_both_readings(predictor):
    with pytest.raises(InputError, match=r"could be 3 prompts of one point or one prompt of 3 points: "
                                         r"pass \(3, 1, 2\) for the first, \(1, 3, 2\) for the second"):
        predictor.predict_batch([_image()], [_points([[1, 1], [2, 2], [3, 3]], [1, 1, 1])])


@pytest.mark.parametrize("prompts, message", [
    (_points([[[1, 1], [2, 2]]], [[1]]), r"labels of shape \(1, 1\) do not match coordinates \(1, 2, 2\)"),
    (_points([[[1, 1]]], [1]), r"point_labels must be \(N, k\), got shape \(1,\)"),
    (Prompts(point_coords=np.ones((2, 1, 2)), point_labels=np.ones((2, 1)), boxes=np.ones((3, 4))),
     "2 point prompts, 2 point labels, 3 boxes"),
    (Prompts(point_coords=np.ones((1, 1, 2))), "point_coords and point_labels go together"),
    (Prompts(boxes=np.array([1, 2, 3, 4])), r"boxes must be \(N, 4\), got shape \(4,\)"),
    (Prompts(boxes=np.array([[30, 5, 10, 20]])), r"box \[30.0, 5.0, 10.0, 20.0\] is inverted"),
    (Prompts(point_coords=[[["a", 1]]], point_labels=[[1]]), "point_coords must hold numbers"),
    (Prompts(point_coords=[[[1, 1]], [[1]]], point_labels=[[1], [1]]), "rectangular array of numbers"),
    (_points([[[np.nan, 1]]], [[1]]), "must hold finite numbers, got nan"),
    (_points([[[1, 1]]], [[None]]), "point_labels must hold numbers"),
    ({"boxes": [[0, 0, 5, 5]]}, r"prompts\[0\] must be a samfast.Prompts, got dict"),
])
def test_malformed_prompts_are_refused_before_the_encoder(predictor, monkeypatch, prompts, message):
    def encoder_must_not_run(*args):
        raise AssertionError("the encoder ran on a batch with a bad prompt")

    monkeypatch.setattr(predictor.model, "embed_images", encoder_must_not_run)
    with pytest.raises(InputError, match=message):
        predictor.predict_batch([_image()], [prompts])


def test_mismatched_lengths_and_bad_images(predictor):
    with pytest.raises(InputError, match="2 images but 1 prompt sets"):
        predictor.predict_batch([_image(), _image()], [Prompts()])
    with pytest.raises(InputError, match=r"images\[1\] must be uint8.*got uint16.*/ 257"):
        predictor.predict_batch([_image(), np.zeros((4, 4), np.uint16)], [Prompts(), Prompts()])
    with pytest.raises(InputError, match=r"images\[0\] is empty: shape \(0, 5, 3\)"):
        predictor.predict_batch([np.zeros((0, 5, 3), np.uint8)], [Prompts()])


def test_predict_shapes_are_checked(image_set):
    predictor = image_set
    with pytest.raises(InputError, match=r"point_coords must be \(k, 2\).*got shape \(1, 1, 2\)"):
        predictor.predict(point_coords=np.ones((1, 1, 2)), point_labels=np.ones((1, 1)))
    with pytest.raises(InputError, match=r"box must be 4 numbers.*got shape \(2, 4\)"):
        predictor.predict(box=np.ones((2, 4)))
    with pytest.raises(InputError, match=r"mask_input must be \(1, 256, 256\).*got \(256, 256\)"):
        predictor.predict(box=np.array([1, 1, 5, 5]), mask_input=np.zeros((256, 256)))


@pytest.mark.parametrize("multimask, outputs", [(True, 3), (False, 1)])
def test_zero_prompts_give_empty_results(predictor, multimask, outputs):
    assert predictor.predict_batch([], []) == []
    none = [Prompts(), Prompts(point_coords=np.zeros((0, 1, 2)), point_labels=np.zeros((0, 1))),
            Prompts(boxes=np.zeros((0, 4)))]
    results = predictor.predict_batch([_image(7, 9)] * 3, none, multimask_output=multimask)
    for result in results:
        assert result.masks.shape == (0, outputs, 7, 9) and result.masks.dtype == torch.bool
        assert result.iou_predictions.shape == (0, outputs)
        assert result.low_res_logits.shape == (0, outputs, 256, 256)


def test_a_one_pixel_strip_is_embedded():
    """1x5000 rounds to height 0 in the reference's resize (a PIL error there); here it is 1 pixel."""
    assert samfast.transforms.preprocess_shape(1, 5000, 1024) == (1, 1024)
    assert samfast.transforms.preprocess_shape(300, 500, 1024) == (614, 1024)  # the reference's rounding


# --- checkpoints ---------------------------------------------------------------------------------
def test_missing_empty_and_directory_checkpoints(tmp_path):
    (tmp_path / "empty.pth").touch()
    cases = {"nope.pth": "checkpoint not found", "empty.pth": r"is empty \(0 bytes\)", ".": "is a directory"}
    for name, message in cases.items():
        with pytest.raises(CheckpointError, match=message):
            samfast.build_sam("vit_tiny", checkpoint=tmp_path / name)


def test_a_load_error_without_a_message_is_named(tmp_path):
    path = tmp_path / "two_bytes.pth"
    path.write_bytes(b"\x80\x02")  # a pickle header and nothing else: torch.load raises EOFError('')
    with pytest.raises(CheckpointError, match=r"two_bytes.pth \(2 bytes\) is not a readable PyTorch checkpoint: EOFError"):
        samfast.build_sam("vit_tiny", checkpoint=path)


# --- COCO loader ---------------------------------------------------------------------------------
def _base_coco() -> dict:
    square = [[2, 2, 8, 2, 8, 6, 2, 6]]
    return {
        "images": [{"id": 3, "file_name": "a.png", "height": 10, "width": 12},
                   {"id": 7, "file_name": "b.png", "height": 10, "width": 12}],
        "annotations": [{"id": 1, "image_id": 3, "category_id": 1, "segmentation": square, "iscrowd": 0},
                        {"id": 2, "image_id": 7, "category_id": 1, "segmentation": square, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "thing"}],
    }


@pytest.fixture
def coco_dir(tmp_path):
    (tmp_path / "images").mkdir()
    for name in ("a.png", "b.png"):
        Image.new("RGB", (12, 10), (90, 120, 150)).save(tmp_path / "images" / name)
    return tmp_path


def _load(folder: Path, coco) -> list:
    ann_file = folder / "instances.json"
    ann_file.write_text(coco if isinstance(coco, str) else json.dumps(coco))
    return list(load_coco(folder / "images", ann_file).samples)


def _write(folder: Path, coco: dict) -> Path:
    (folder / "instances.json").write_text(json.dumps(coco))
    return folder / "instances.json"


def _mutated(change):
    coco = _base_coco()
    change(coco)
    return coco


MALFORMED = {
    "not json": ("{'images': []", "is not valid JSON"),
    "a list": ([1, 2], "the top level must be a JSON object.*got a list"),
    "no annotations": (_mutated(lambda c: c.pop("annotations")), "has no 'annotations'"),
    "images a dict": (_mutated(lambda c: c.update(images={})), "has an object as 'images'"),
    "image without file_name": (_mutated(lambda c: c["images"][1].pop("file_name")), "image id 7 needs a 'file_name'"),
    "image without height": (_mutated(lambda c: c["images"][0].pop("height")), "image id 3 has no 'height'"),
    "image id a string": (_mutated(lambda c: c["images"][0].update(id="3")), r"images\[0\]: id must be an integer, got '3'"),
    "zero width": (_mutated(lambda c: c["images"][0].update(width=0)), "image id 3: width must be an integer >= 1"),
    "duplicate image ids": (_mutated(lambda c: c["images"][1].update(id=3)),
                            r"image id 3 appears twice \(images\[0\] and images\[1\]\)"),
    "annotation id a float": (_mutated(lambda c: c["annotations"][1].update(id=2.0)),
                              r"annotations\[1\]: id must be an integer, got 2.0"),
    "annotation id a bool": (_mutated(lambda c: c["annotations"][0].update(id=True)), "id must be an integer, got True"),
    "duplicate annotation ids": (_mutated(lambda c: c["annotations"][1].update(id=1)),
                                 r"annotation id 1 appears twice \(annotations\[0\] and annotations\[1\]\)"),
    "no image_id": (_mutated(lambda c: c["annotations"][0].pop("image_id")), "annotation id 1 has no 'image_id'"),
    "unknown image": (_mutated(lambda c: c["annotations"][0].update(image_id=99)),
                      "annotation id 1 belongs to image id 99, which is not in 'images'"),
    "categories an object": (_mutated(lambda c: c.update(categories={"id": 1})), "has an object as 'categories'"),
    "no category_id": (_mutated(lambda c: c["annotations"][1].pop("category_id")), "annotation id 2 has no 'category_id'"),
    "no segmentation": (_mutated(lambda c: c["annotations"][1].pop("segmentation")), "annotation id 2 has no 'segmentation'"),
    "odd polygon": (_mutated(lambda c: c["annotations"][0].update(segmentation=[[1, 1, 5, 1, 5, 5, 1]])),
                    "annotation id 1: polygon 0 has 7 numbers"),
    "short polygon": (_mutated(lambda c: c["annotations"][0].update(segmentation=[[1, 1, 5, 5]])),
                      "annotation id 1: polygon 0 has 4 numbers"),
    "text in a polygon": (_mutated(lambda c: c["annotations"][0].update(segmentation=[[1, 1, "5", 1, 5, 5]])),
                          "annotation id 1: polygon 0 must be a list of finite numbers"),
    "NaN in a polygon": (_mutated(lambda c: c["annotations"][0].update(segmentation=[[1, 1, float("nan"), 1, 5, 5]])),
                         "annotation id 1: polygon 0 must be a list of finite numbers"),
    "RLE of another size": (_mutated(lambda c: c["annotations"][0].update(segmentation={"size": [12, 10], "counts": "0h3"})),
                            r"annotation id 1: RLE size \[12, 10\] is not its image's \[height, width\] \[10, 12\]"),
    "RLE garbage": (_mutated(lambda c: c["annotations"][0].update(segmentation={"size": [10, 12], "counts": "abc"})),
                    "annotation id 1: RLE counts"),
    "RLE too short": (_mutated(lambda c: c["annotations"][0].update(segmentation={"size": [10, 12], "counts": [5, 5]})),
                      "annotation id 1: RLE counts cover 10 pixels, its 12x10 image has 120"),
    "iscrowd 2": (_mutated(lambda c: c["annotations"][0].update(iscrowd=2)), "annotation id 1: iscrowd must be 0 or 1"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_annotation_files_name_the_file_and_the_item(coco_dir, case):
    coco, message = MALFORMED[case]
    with pytest.raises(DataError, match=message) as err:
        _load(coco_dir, coco)
    assert str(coco_dir / "instances.json") in str(err.value)


def test_the_valid_base_loads(coco_dir):
    """The control: every MALFORMED case is this file with one defect."""
    samples = _load(coco_dir, _base_coco())
    assert [[a.ann_id for a in s.annotations] for s in samples] == [[1], [2]]


@pytest.mark.parametrize("file_name", ["../outside.png", "/etc/hostname", "link.png"])
def test_file_names_must_resolve_inside_the_image_folder(coco_dir, file_name):
    Image.new("RGB", (12, 10)).save(coco_dir / "outside.png")
    (coco_dir / "images" / "link.png").symlink_to(coco_dir / "outside.png")
    with pytest.raises(DataError, match=rf"file_name '{file_name}' resolves to .*, outside the image folder"):
        _load(coco_dir, _mutated(lambda c: c["images"][1].update(file_name=file_name)))


def test_a_symlink_inside_the_folder_is_fine(coco_dir):
    (coco_dir / "images" / "inner.png").symlink_to(coco_dir / "images" / "a.png")
    assert len(_load(coco_dir, _mutated(lambda c: c["images"][1].update(file_name="inner.png")))) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_unreadable_images_name_the_file_and_the_image(coco_dir, damage):
    path = coco_dir / "images" / "b.png"
    noise = np.random.default_rng(0).integers(0, 256, (10, 12, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path)  # incompressible: half the file is half the pixels
    path.write_bytes(b"not an image" if damage == "garbage" else path.read_bytes()[: path.stat().st_size // 2])
    samples = load_coco(coco_dir / "images", _write(coco_dir, _base_coco())).samples
    assert samples[0].image.shape == (10, 12, 3)
    with pytest.raises(DataError, match=rf"image id 7: {path} is not a readable image"):
        samples[1]


def test_16_bit_images_are_scaled_by_their_range_not_clipped(coco_dir):
    eight_bit = np.arange(120, dtype=np.uint8).reshape(10, 12) * 2
    Image.fromarray(eight_bit.astype(np.uint16) * 257).save(coco_dir / "images" / "a.png")  # mode I;16
    assert Image.open(coco_dir / "images" / "a.png").mode == "I;16"
    image = load_coco(coco_dir / "images", _write(coco_dir, _base_coco())).samples[0].image
    np.testing.assert_array_equal(image, np.repeat(eight_bit[:, :, None], 3, axis=2))


@pytest.mark.parametrize("array, kind", [(np.ones((10, 12), np.float32), "floating-point"),
                                         (np.ones((10, 12), np.int32), "32-bit integer")])
def test_images_of_undefined_range_are_refused(coco_dir, array, kind):
    Image.fromarray(array).save(coco_dir / "images" / "c.tif")
    coco = _mutated(lambda c: c["images"][0].update(file_name="c.tif"))
    with pytest.raises(DataError, match=rf"image id 3: .*c.tif is a {kind} image"):
        load_coco(coco_dir / "images", _write(coco_dir, coco)).samples[0]


# --- the command line ------------------------------------------------------------------------------
def _main(argv, capsys) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exit:  # argparse's own exit
        code = exit.code
    return code, capsys.readouterr().err


@pytest.fixture
def bad_paths(tmp_path, coco_dir):
    (tmp_path / "empty.pth").touch()
    (tmp_path / "a_file").write_text("x")
    return {
        "empty": str(tmp_path / "empty.pth"), "file": str(tmp_path / "a_file"), "dir": str(tmp_path),
        "images": str(coco_dir / "images"),
        "dup_ann": str(_write(coco_dir, _mutated(lambda c: c["annotations"][1].update(id=1)))),
        "reports": str(tmp_path / "reports"),
    }


CLI_CASES = {
    "batch size 0": ("check --batch-size 0", "argument --batch-size: must be at least 1, got 0"),
    "golden batch size -1": ("golden --batch-size -1", "argument --batch-size: must be at least 1, got -1"),
    "limit 0": ("check --limit 0", "argument --limit: must be at least 1"),
    "limit not a number": ("check --limit ten", "argument --limit: expected a whole number >= 1, got 'ten'"),
    "seed out of range": ("golden --seed -1", "argument --seed: expected a whole number from 0"),
    "unknown device": ("check --device tpu", "'tpu' is not a device the gate runs on"),
    "unknown stage": ("check --stages fp32 fp33", "unknown stage 'fp33'"),
    "unknown model": ("check --model vit_x", "invalid choice: 'vit_x'"),
    "unknown command": ("regenerate", "invalid choice: 'regenerate'"),
    "coco root alone": ("check --coco-root {images}", "--coco-root and --ann-file go together"),
    "missing checkpoint": ("check --checkpoint {dir}/nope.pth --report-dir {reports}", "checkpoint not found"),
    "empty checkpoint": ("check --checkpoint {empty} --report-dir {reports}", "is empty (0 bytes)"),
    "directory checkpoint": ("check --checkpoint {dir} --report-dir {reports}", "is a directory"),
    "report dir a file": ("check --report-dir {file}", "--report-dir {file} is a file, not a folder"),
    "golden root a file": ("golden --golden-root {file}", "--golden-root {file} is a file, not a folder"),
    "duplicate annotation ids": ("golden --golden-root {reports} --coco-root {images} --ann-file {dup_ann}",
                                 "annotation id 1 appears twice"),
    "unknown dataset": ("check --data {dir}/nowhere --report-dir {reports}", "is neither a known dataset"),
}


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_bad_input_is_one_line_and_exit_2(case, bad_paths, capsys):
    args, message = (text.format(**bad_paths) for text in CLI_CASES[case])
    code, err = _main(args.split(), capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_cuda_without_a_gpu(capsys):
    code, err = _main(["check", "--device", "cuda"], capsys)
    assert code == 2 and "cuda asked for, but this machine has no usable CUDA GPU" in err


@pytest.mark.parametrize("code_, reason", [(errno.EROFS, "Read-only file system"), (errno.ENOSPC, "No space left"),
                                           (errno.EACCES, "Permission denied")])
def test_an_unwritable_report_folder_fails_before_anything_is_loaded(tmp_path, monkeypatch, capsys, code_, reason):
    """Root writes through chmod 000, so the OS's answer is planted; a bad --data shows the order."""
    def refuse(*args, **kwargs):
        raise OSError(code_, os.strerror(code_))

    monkeypatch.setattr(cli.tempfile, "TemporaryFile", refuse)
    code, err = _main(["check", "--report-dir", str(tmp_path), "--data", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"--report-dir {tmp_path} cannot be written ({reason}" in err


def test_the_write_probe_leaves_nothing_behind(tmp_path):
    cli.check_writable(tmp_path / "new" / "reports", "--report-dir")
    assert list((tmp_path / "new" / "reports").iterdir()) == []


def test_an_unreadable_image_fails_golden_with_exit_2(coco_dir, tmp_path, capsys):
    (coco_dir / "images" / "a.png").write_bytes(b"broken")
    code, err = _main(["golden", "--golden-root", str(tmp_path / "golden"), "--coco-root", str(coco_dir / "images"),
                       "--ann-file", str(_write(coco_dir, _base_coco())), "--device", "cpu"], capsys)
    assert code == 2 and "image id 3:" in err and "a.png is not a readable image" in err
    assert not list((tmp_path / "golden").glob("[!.]*"))  # no golden (a hidden resumable work folder may stay)


SUBPROCESS_CASES = ["golden batch size -1", "directory checkpoint", "duplicate annotation ids"]


@pytest.fixture(scope="module")
def subprocess_runs(tmp_path_factory):
    """All cases started at once: each pays python's and torch's start-up, so overlap them."""
    root = tmp_path_factory.mktemp("cli")
    (root / "images").mkdir()
    Image.new("RGB", (12, 10)).save(root / "images" / "a.png")
    paths = {"dir": str(root), "reports": str(root / "reports"), "images": str(root / "images"),
             "dup_ann": str(_write(root, _mutated(lambda c: c["annotations"][1].update(id=1))))}
    env = child_env(OMP_NUM_THREADS="1")
    running = {
        case: subprocess.Popen([sys.executable, "-m", "parity", *CLI_CASES[case][0].format(**paths).split()],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for case in SUBPROCESS_CASES
    }
    return {case: (process.communicate(timeout=600)[1], process.returncode, paths) for case, process in running.items()}


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_python_m_parity_prints_one_line_and_exits_2(subprocess_runs, case):
    err, code, paths = subprocess_runs[case]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert CLI_CASES[case][1].format(**paths) in err


def test_a_damaged_budgets_file_is_bad_input_but_a_defect_of_ours_is_not(tmp_path, capsys, monkeypatch):
    """Exit 2 means bad input only: a budgets.toml that is not TOML says so in one line, while a plain
    ValueError from our own code keeps its traceback (exit 1) instead of passing for bad input."""
    from parity.compare.gates import load_thresholds
    from parity.tasks import check

    broken = tmp_path / "budgets.toml"
    broken.write_text("[accuracy.fp32\nmin_mean_iou = ")
    monkeypatch.setattr(check, "load_thresholds", lambda **k: load_thresholds(broken, **k))
    argv = ["check", "--stages", "fp32", "--report-dir", str(tmp_path / "reports")]
    code, err = _main(argv, capsys)
    assert code == 2 and f"{broken}: not valid TOML" in err and "Traceback" not in err

    def defect(*args, **kwargs):
        raise ValueError("an internal mistake")

    monkeypatch.setattr(check, "load_thresholds", defect)
    with pytest.raises(ValueError, match="an internal mistake"):
        cli.main(argv)
