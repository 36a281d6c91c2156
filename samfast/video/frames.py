"""A video's frames as the tracker's input: (T, 3, S, S) float32, stretched to S x S and normalized.

The same steps as sam2.utils.misc.load_video_frames, so the frames are the same bits: each frame is
resized by PIL to S x S (PIL's default filter, bicubic), divided by 255 in float64, stored as
float32, then the ImageNet mean subtracted and the std divided out in float32. Besides sam2's
sources (a folder of JPEG frames named by their index, an .mp4 through decord) it takes frames in
memory: a list of HxWx3 uint8 arrays or PIL images, or a (T, H, W, 3) uint8 array or tensor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from samfast.transforms import InputError

IMG_MEAN = (0.485, 0.456, 0.406)
IMG_STD = (0.229, 0.224, 0.225)
JPEG_EXTENSIONS = (".jpg", ".jpeg", ".JPG", ".JPEG")

VideoSource = str | os.PathLike | bytes | Sequence | np.ndarray | torch.Tensor


def load_video_frames(
    video: VideoSource,
    image_size: int,
    offload_video_to_cpu: bool,
    compute_device: torch.device,
    img_mean: tuple[float, float, float] = IMG_MEAN,
    img_std: tuple[float, float, float] = IMG_STD,
) -> tuple[torch.Tensor, int, int]:
    """(frames (T, 3, S, S) float32, video height, video width); the frames on compute_device
    unless offload_video_to_cpu."""
    if isinstance(video, bytes) or (isinstance(video, (str, os.PathLike)) and Path(video).suffix in (".mp4", ".MP4")):
        images, height, width = _frames_from_video_file(video, image_size)
    elif isinstance(video, (str, os.PathLike)):
        if not Path(video).is_dir():
            raise InputError(f"{video}: not a folder of JPEG frames nor an .mp4 file")
        images, height, width = _frames_from_jpeg_folder(Path(video), image_size)
    else:
        images, height, width = _frames_from_arrays(video, image_size)
    mean = torch.tensor(img_mean, dtype=torch.float32)[:, None, None]
    std = torch.tensor(img_std, dtype=torch.float32)[:, None, None]
    if not offload_video_to_cpu:
        images, mean, std = images.to(compute_device), mean.to(compute_device), std.to(compute_device)
    images -= mean
    images /= std
    return images, height, width


def _resized(image: Image.Image, image_size: int) -> torch.Tensor:
    """(3, S, S) float64 in [0, 1]: sam2's _load_img_as_tensor."""
    array = np.array(image.convert("RGB").resize((image_size, image_size)))
    return torch.from_numpy(array / 255.0).permute(2, 0, 1)


def _stack(frames: Sequence[Image.Image], image_size: int) -> tuple[torch.Tensor, int, int]:
    if len(frames) == 0:
        raise InputError("the video has no frames")
    images = torch.zeros(len(frames), 3, image_size, image_size, dtype=torch.float32)
    for n, frame in enumerate(frames):
        images[n] = _resized(frame, image_size)  # float64 -> float32, as sam2 stores them
        width, height = frame.size
    return images, height, width


class _LazyImages(Sequence):
    """Frames opened one at a time (JPEG files are decoded inside _stack's loop, not all at once)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index):
        with Image.open(self.paths[index]) as image:
            image.load()
            return image


def _frames_from_jpeg_folder(folder: Path, image_size: int) -> tuple[torch.Tensor, int, int]:
    """JPEG files named by their frame index ("00000.jpg", "1.jpeg", ...), in index order."""
    names = [p for p in os.listdir(folder) if os.path.splitext(p)[-1] in JPEG_EXTENSIONS]
    try:
        names.sort(key=lambda p: int(os.path.splitext(p)[0]))
    except ValueError:
        raise InputError(f"{folder}: JPEG frames must be named by their index (00000.jpg, 00001.jpg, ...)") from None
    if not names:
        raise InputError(f"no images found in {folder}")
    return _stack(_LazyImages([folder / name for name in names]), image_size)


def _frames_from_arrays(video, image_size: int) -> tuple[torch.Tensor, int, int]:
    if isinstance(video, torch.Tensor):
        video = video.cpu().numpy()
    if isinstance(video, np.ndarray):
        if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8:
            raise InputError(f"a video array must be (T, H, W, 3) uint8 RGB, got {video.dtype} {tuple(video.shape)}")
        video = list(video)
    if not isinstance(video, Sequence):
        raise InputError(
            f"init_state takes a folder of JPEG frames, an .mp4 path, a list of HxWx3 uint8 frames or a "
            f"(T, H, W, 3) uint8 array, not {type(video).__name__}"
        )
    frames = []
    for frame in video:
        if isinstance(frame, torch.Tensor):
            frame = frame.cpu().numpy()
        if isinstance(frame, np.ndarray):
            if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
                raise InputError(f"a frame must be HxWx3 uint8 RGB, got {frame.dtype} {tuple(frame.shape)}")
            frame = Image.fromarray(frame)
        elif not isinstance(frame, Image.Image):
            raise InputError(f"a frame must be an HxWx3 uint8 array or a PIL image, not {type(frame).__name__}")
        frames.append(frame)
    return _stack(frames, image_size)


def _frames_from_video_file(video: str | os.PathLike | bytes, image_size: int) -> tuple[torch.Tensor, int, int]:
    """An .mp4 (path or bytes) decoded and resized by decord, as sam2 does it."""
    try:
        import decord
    except ImportError:
        raise InputError(
            "reading an .mp4 needs decord (pip install decord); or extract its frames to a folder of JPEGs "
            "(ffmpeg -i video.mp4 -q:v 2 -start_number 0 frames/'%05d.jpg') and pass the folder"
        ) from None
    decord.bridge.set_bridge("torch")
    source = os.fspath(video) if not isinstance(video, bytes) else video
    height, width, _ = decord.VideoReader(source).next().shape
    images = [frame.permute(2, 0, 1) for frame in decord.VideoReader(source, width=image_size, height=image_size)]
    return torch.stack(images, dim=0).float() / 255.0, height, width
