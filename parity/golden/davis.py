"""DAVIS-layout video folders as Clips: real videos with per-frame instance masks for the video task.

The DAVIS 2017 layout (semi-supervised trainval), with or without the resolution level:

    <root>/JPEGImages/480p/<video>/00000.jpg 00001.jpg ...
    <root>/Annotations/480p/<video>/00000.png 00001.png ...

Annotation PNGs are palette (P) or grayscale (L) images whose pixel values are object ids: 0 is the
background. The objects of a clip are the ids present in any annotation of the frames read, in
increasing id order; they become the clip's masks in that order (tracker ids 1..K; DavisClip.davis_ids
keeps the original ids).

Every frame read needs its annotation: the video task scores every frame's J&F against the ground
truth, so DAVIS test-dev (annotated on the first frame only) is refused, naming the first missing PNG.

Bad folders are refused as parity.golden.data refuses COCO data: DataNotFoundError for a folder that
is not there, DataError for a file that cannot be used, each naming the path and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from parity.golden.coco_format import DataError
from parity.golden.data import _read_rgb
from parity.golden.settings import DATA_ENV, DataNotFoundError, dataset_dir
from parity.golden.videos import Clip

DAVIS_NAME = "davis"  # --data davis is the folder $SAMFAST_DATA/davis
DAVIS_READER = "davis-v1"  # recorded in goldens: another reading of the same files is other data
RESOLUTION = "480p"  # the level DAVIS 2017 puts between JPEGImages/ (or Annotations/) and the videos
# Some DAVIS sets (2016-style annotations) mark object borders and ambiguous pixels 255, "void": no
# object is there, and no tracker is asked to segment it, so it reads as background.
VOID_ID = 255
ANNOTATION_MODES = ("P", "L")  # palette or grayscale: one object id per pixel

_LAYOUT = (
    "a DAVIS folder holds JPEGImages/480p/<video>/*.jpg and Annotations/480p/<video>/*.png "
    "(or the same without 480p/)"
)


@dataclass(frozen=True)
class DavisClip(Clip):
    """A DAVIS video: Clip's frames and masks, plus where they came from."""

    name: str  # the video's folder name, e.g. "bear"
    davis_ids: tuple[int, ...]  # the annotation id of each object, in masks order


def davis_folder(name_or_path: str | Path) -> Path:
    """The folder `--data` names: "davis" under the data folder ($SAMFAST_DATA), else a path as given."""
    return dataset_dir(DAVIS_NAME) if str(name_or_path) == DAVIS_NAME else Path(name_or_path)


def read_davis(root: str | Path, videos: int | None = None, max_frames: int | None = None) -> list[DavisClip]:
    """The first `videos` videos of `root` by folder name (all when None), each its first `max_frames`
    frames by file name (all when None), as clips numbered 1, 2, ... in that order."""
    root = Path(root)
    frames_root, annotations_root = _level(root, "JPEGImages"), _level(root, "Annotations")
    names = _video_names(frames_root, videos)
    return [_read_video(video_id, name, frames_root / name, annotations_root / name, max_frames)
            for video_id, name in enumerate(names, start=1)]


def _level(root: Path, kind: str) -> Path:
    """root/kind/480p when it exists, else root/kind (the layout without the resolution level)."""
    folder = root / kind
    if not folder.is_dir():
        raise DataNotFoundError(f"{folder} is missing: {_LAYOUT}; pass such a folder as --data <folder>, "
                                f"or put it at ${DATA_ENV}/{DAVIS_NAME} for --data {DAVIS_NAME}")
    return folder / RESOLUTION if (folder / RESOLUTION).is_dir() else folder


def _video_names(frames_root: Path, videos: int | None) -> list[str]:
    names = sorted(p.name for p in frames_root.iterdir() if p.is_dir())
    if not names:
        raise DataNotFoundError(f"{frames_root} holds no video folders: {_LAYOUT}")
    if videos is not None and videos > len(names):
        raise DataError(f"{videos} videos asked for, but {frames_root} holds {len(names)}; pass --videos {len(names)} or fewer")
    return names[:videos]


def _read_video(video_id: int, name: str, frame_dir: Path, annotation_dir: Path, max_frames: int | None) -> DavisClip:
    frame_files = sorted(frame_dir.glob("*.jpg"), key=lambda p: p.name)[:max_frames]
    if not frame_files:
        raise DataError(f"{frame_dir} holds no frames (*.jpg): remove the folder or put the video's frames in it")
    if not annotation_dir.is_dir():
        raise DataNotFoundError(f"{annotation_dir} is missing: every video in JPEGImages needs its folder of "
                                f"annotation PNGs; {_LAYOUT}")
    frames = _read_frames(frame_files)
    ids = np.stack([_read_annotation(_annotation_of(path, annotation_dir), path, frame.shape[:2])
                    for path, frame in zip(frame_files, frames)])
    object_ids = [int(i) for i in np.unique(ids) if i != 0]  # np.unique sorts: increasing id order
    if not object_ids:
        raise DataError(f"{annotation_dir}: no object in the annotations of the {len(frame_files)} frame(s) read "
                        "(every pixel 0 or 255): nothing to track; remove the video or fix its annotations")
    masks = ids[None] == np.array(object_ids, dtype=ids.dtype)[:, None, None, None]
    return DavisClip(video_id, frames, masks, name, tuple(object_ids))


def _read_frames(paths: list[Path]) -> np.ndarray:
    """(T, H, W, 3) uint8 RGB; every frame of a video must have the first one's size (they are stacked)."""
    frames = []
    for path in paths:
        frame = _read_rgb(path)  # DataError naming the file when it is not a readable image
        if frames and frame.shape != frames[0].shape:
            raise DataError(f"{path} is {frame.shape[1]}x{frame.shape[0]} but {paths[0].name} of the same video is "
                            f"{frames[0].shape[1]}x{frames[0].shape[0]}: a video's frames must share one size")
        frames.append(frame)
    return np.stack(frames)


def _annotation_of(frame: Path, annotation_dir: Path) -> Path:
    path = annotation_dir / f"{frame.stem}.png"
    if not path.is_file():
        raise DataError(f"{path} is missing: frame {frame} has no annotation. The video task scores every frame "
                        "against its ground truth, so every frame needs its PNG (DAVIS test-dev annotates only "
                        "the first frame: use trainval), or pass --video-frames to stop before it")
    return path


def _read_annotation(path: Path, frame: Path, size: tuple[int, int]) -> np.ndarray:
    """The HxW object ids of an annotation PNG, void (255) as background."""
    try:
        with Image.open(path) as image:
            if image.mode not in ANNOTATION_MODES:
                raise DataError(f"{path} is a PIL mode {image.mode} image: DAVIS annotations are palette (P) or "
                                "grayscale (L) PNGs whose pixel values are object ids; save it in one of those modes")
            ids = np.array(image)  # a palette image's values are its indices: the ids, not the colours
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 (PIL raises many kinds: OSError for a truncated file, SyntaxError, ...)
        raise DataError(f"{path} is not a readable image ({type(err).__name__}: {err}); replace the file") from None
    if ids.shape != size:
        raise DataError(f"{path} is {ids.shape[1]}x{ids.shape[0]} but its frame {frame} is {size[1]}x{size[0]}: "
                        "an annotation must have its frame's size")
    ids[ids == VOID_ID] = 0
    return ids
