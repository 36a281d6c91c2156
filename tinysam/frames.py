"""How an image and its prompts enter each family's model: its input frame.

SAM 1 resizes an image so that its longest side is 1024 and pads it at the bottom and right to
the 1024 square (LONGEST_SIDE); SAM 2 stretches every image to 1024 x 1024 (STRETCHED). Either
way the decoder's 256 x 256 logits cover the 1024 square, so the rest of tinysam works in the
frame's (h, w), the size the image has inside that square: the pool stores images in the frame
(`fit`), targets are integrated over it (tinysam.targets.lowres_target(mask, (h, w))), the
sampler scales prompts by (w / W, h / H) into it, flips mirror inside it, and the padding
(none when stretched) stays bottom-right. What still differs is here: the resize itself, the
pixel normalisation, and how validation hands an image and its prompts to the predictor.
"""

from __future__ import annotations

import numpy as np
import torch

from samfast.config import IMAGE_SIZE
from samfast.modeling.sam2_prompting.transforms import PIXEL_MEAN as SAM2_PIXEL_MEAN
from samfast.modeling.sam2_prompting.transforms import PIXEL_STD as SAM2_PIXEL_STD
from samfast.modeling.sam2_prompting.transforms import SAM2Transforms, stretch_to_square
from samfast.modeling.sam2_prompting.transforms import to_tensor as sam2_to_tensor
from samfast.transforms import preprocess_shape, resize_longest_side, scale_coords, to_rgb_uint8


class LongestSide:
    """SAM 1's frame: longest side to 1024 (PIL bilinear, as segment_anything), zero padding after
    normalisation, pixel statistics in 0..255 units (the model's own buffers)."""

    name = "longest side 1024, padded"

    def fit(self, image: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
        """(h x w x 3 uint8 resized image, (h, w)) of an H x W x 3 image."""
        return resize_longest_side(image, IMAGE_SIZE), preprocess_shape(*image.shape[:2], IMAGE_SIZE)

    def pixel_stats(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std), (3, 1, 1) on the model's device, for uint8 pixels."""
        return model.pixel_mean, model.pixel_std

    def validation_input(self, image: np.ndarray, device: torch.device) -> torch.Tensor:
        """What `set_image` takes, made once per validation set: (1, 3, h, w) uint8 on the device,
        resized as SamPredictor.set_image resizes."""
        resized = resize_longest_side(to_rgb_uint8(image), IMAGE_SIZE)
        return torch.as_tensor(resized, device=device).permute(2, 0, 1)[None].contiguous()

    def set_image(self, predictor, image: torch.Tensor, original_size: tuple[int, int]) -> None:
        predictor.set_torch_image(image, original_size)

    def to_input_frame(self, coords: np.ndarray, original_size: tuple[int, int]) -> np.ndarray:
        """(..., 2) pixel x, y of the original image in the input frame."""
        return scale_coords(coords, original_size, IMAGE_SIZE)


class Stretched:
    """SAM 2's frame (samfast.modeling.sam2_prompting.transforms): stretched to 1024 x 1024, bilinear with antialiasing,
    ImageNet statistics; no padding."""

    name = "stretched to 1024 x 1024"

    def __init__(self) -> None:
        self.transforms = SAM2Transforms(IMAGE_SIZE, mask_threshold=0.0)

    def fit(self, image: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
        """(1024 x 1024 x 3 uint8 stretched image, (1024, 1024)): SAM2Transforms' resize, rounded
        to uint8 for the pool (at most half a level from the float the predictor makes)."""
        stretched = stretch_to_square(sam2_to_tensor(image)[None], IMAGE_SIZE)[0]
        pixels = (stretched * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)
        return pixels.numpy(), (IMAGE_SIZE, IMAGE_SIZE)

    def pixel_stats(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """ImageNet's (mean, std) of [0, 1] pixels, scaled to uint8 pixels: (x - 255 m) / (255 s)."""
        mean, std = (255 * torch.tensor(stats, device=model.device).view(3, 1, 1) for stats in (SAM2_PIXEL_MEAN, SAM2_PIXEL_STD))
        return mean, std

    def validation_input(self, image: np.ndarray, device: torch.device) -> np.ndarray:
        """The RGB image itself: the predictor's set_image transforms it, so validation measures
        the exact path users run (about 10 ms of CPU per image)."""
        return to_rgb_uint8(image)

    def set_image(self, predictor, image: np.ndarray, original_size: tuple[int, int]) -> None:
        predictor.set_image(image)

    def to_input_frame(self, coords: np.ndarray, original_size: tuple[int, int]) -> np.ndarray:
        """(..., 2) pixel x, y of the original image in the input frame: x * 1024 / W, y * 1024 / H."""
        coords = torch.as_tensor(np.asarray(coords, dtype=np.float64))
        return self.transforms.transform_coords(coords, normalize=True, orig_hw=original_size).numpy()


LONGEST_SIDE = LongestSide()
STRETCHED = Stretched()
