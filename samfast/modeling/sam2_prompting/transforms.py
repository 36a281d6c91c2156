"""SAM 2's input and output transforms (sam2.utils.transforms.SAM2Transforms), without torchvision.

Unlike SAM 1 (longest side to 1024, then padding), SAM 2 stretches every image to 1024 x 1024:
to_tensor ([0, 1] floats), a bilinear resize with antialiasing (what torchvision's Resize does to a
float tensor), ImageNet normalization. Prompts are scaled by 1024 / width and 1024 / height.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from samfast.modeling.connected_components import component_sizes

# ImageNet statistics, applied to [0, 1] pixels
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)


def to_tensor(image: np.ndarray | Image.Image) -> torch.Tensor:
    """(3, H, W) float of an HxWx3 RGB array or a PIL image: uint8 scaled to [0, 1], other dtypes
    kept as they are (torchvision's ToTensor). PIL images of other modes are converted to RGB."""
    if isinstance(image, Image.Image):
        image = np.array(image.convert("RGB"))
    tensor = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
    return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor


def stretch_to_square(images: torch.Tensor, resolution: int) -> torch.Tensor:
    """(B, C, H, W) floats stretched to resolution x resolution: a bilinear resize with antialiasing,
    what torchvision's Resize does to a float tensor (tinysam stores its training images this way)."""
    return F.interpolate(images, size=(resolution, resolution), mode="bilinear", align_corners=False, antialias=True)


class SAM2Transforms:
    def __init__(self, resolution: int, mask_threshold: float, max_hole_area: float = 0.0, max_sprinkle_area: float = 0.0,
                 connected_components: bool = False):
        """connected_components: fill holes and remove sprinkles as sam3's predictor does (it always has
        connected components); without, warn and skip as sam2 does without its CUDA extension."""
        self.resolution = resolution
        self.mask_threshold = mask_threshold
        self.max_hole_area = max_hole_area
        self.max_sprinkle_area = max_sprinkle_area
        self.connected_components = connected_components
        self.mean = torch.tensor(PIXEL_MEAN).view(-1, 1, 1)
        self.std = torch.tensor(PIXEL_STD).view(-1, 1, 1)

    def __call__(self, image: np.ndarray | Image.Image) -> torch.Tensor:
        """(3, 1024, 1024) model input of one image."""
        x = stretch_to_square(to_tensor(image)[None], self.resolution)[0]
        return (x - self.mean) / self.std

    def forward_batch(self, img_list: list[np.ndarray]) -> torch.Tensor:
        return torch.stack([self(img) for img in img_list])

    def transform_coords(
        self, coords: torch.Tensor, normalize: bool = False, orig_hw: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """(..., 2) x, y to the 1024 x 1024 input frame; normalize: they are in pixels of an orig_hw image
        (else already in [0, 1])."""
        if normalize:
            h, w = orig_hw
            coords = torch.stack([coords[..., 0] / w, coords[..., 1] / h], dim=-1)
        return coords * self.resolution

    def transform_boxes(
        self, boxes: torch.Tensor, normalize: bool = False, orig_hw: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """(B, 4) x0 y0 x1 y1 boxes to (B, 2, 2) corners in the input frame."""
        return self.transform_coords(boxes.reshape(-1, 2, 2), normalize, orig_hw)

    def postprocess_masks(self, masks: torch.Tensor, orig_hw: tuple[int, int]) -> torch.Tensor:
        """Low-res logits (B, M, 256, 256) bilinearly upsampled to the image size, in fp32.

        With max_hole_area or max_sprinkle_area > 0, sam2 fills small holes and removes small
        sprinkles with the connected components of its CUDA extension; when that extension is
        missing (pip installs without it unless built with CUDA) it warns and skips the step, as
        samfast does for SAM 2. sam3's predictor always has connected components (cc_torch, its Triton
        kernel, scikit-image): with `connected_components` samfast fills as it does, with
        samfast.modeling.connected_components: background components of at most max_hole_area
        low-resolution pixels become threshold + 10, then foreground ones of at most max_sprinkle_area
        threshold - 10, each (B, M) mask on its own, 8-connected.
        """
        masks = masks.float()
        if self.connected_components:
            if self.max_hole_area > 0:
                holes = component_sizes(masks <= self.mask_threshold)
                masks = torch.where((holes > 0) & (holes <= self.max_hole_area), self.mask_threshold + 10.0, masks)
            if self.max_sprinkle_area > 0:
                sprinkles = component_sizes(masks > self.mask_threshold)
                masks = torch.where((sprinkles > 0) & (sprinkles <= self.max_sprinkle_area), self.mask_threshold - 10.0, masks)
        elif self.max_hole_area > 0 or self.max_sprinkle_area > 0:
            warnings.warn(
                "max_hole_area / max_sprinkle_area > 0: skipping the hole and sprinkle removal, as sam2 does "
                "without its CUDA extension (the sam2 samfast's SAM 2 is checked against).",
                category=UserWarning,
                stacklevel=2,
            )
        return F.interpolate(masks, orig_hw, mode="bilinear", align_corners=False)
