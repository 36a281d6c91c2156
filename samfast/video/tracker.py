"""Tracker: what a family's model provides to be tracked by samfast.VideoPredictor.

A tracker of SAM 2's design takes, per frame, the image features, one step per object (or per batch
of objects) that reads the object's MemoryBank and returns a FrameOutput, and a memory encoder that
turns a frame's mask into the memory later steps read. The predictor (prompts, propagation, objects,
their banks) and the video task (parity/tasks/video) call a model through this protocol only, so a
family supplies tracking by implementing it (SAM 2: samfast.sam2.tracker.SAM2Tracking) and imports
nothing of another family's.

The shapes are those of SAM 2's step: a frame's features as num_feature_levels levels of (HW, B, C)
tokens, the last the lowest resolution, the one the memory attention reads; masks (B, 1, h, w) logits.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

import torch

from samfast.video.memory_bank import FrameOutput, MemoryBank, StackedMemoryBanks

# what the tracker's forward_image returns per level (each a list of levels, batch first) and what
# frame_features reads back: the features the predictor caches, expands to a batch of objects and
# concatenates across videos
FRAME_FEATURE_KEYS = ("backbone_fpn", "vision_pos_enc")


class Tracker(Protocol):
    """The model side of video tracking. Attributes: image_size, the square input side frames are
    resized to; num_maskmem, the memory frames a step attends to (the conditioning frame included)."""

    image_size: int
    num_maskmem: int

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are: the device frames are encoded and tracked on."""

    @property
    def memory_stride(self) -> int:
        """Every how many frames a tracked frame's memory is read (XMem's r; 1: every frame)."""

    @property
    def batches_objects(self) -> bool:
        """Whether several objects may take one step or one memory encoding as a batch (False when the
        model constrains the objects of a frame against each other, which a batch would apply across them)."""

    def forward_image(self, images: torch.Tensor) -> dict[str, list[torch.Tensor]]:
        """The image features of (T, 3, image_size, image_size) normalized frames: FRAME_FEATURE_KEYS
        each a list of (T, C, h, w) levels."""

    def frame_features(
        self, backbone_out: dict[str, list[torch.Tensor]]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[tuple[int, int]]]:
        """(vision_feats, vision_pos_embeds, feat_sizes) of forward_image's levels (one frame, expanded to
        a batch of B objects): (HW, B, C) tokens per level and each level's (h, w)."""

    def memory_selection_key(
        self, output_dict: MemoryBank, frame_idx: int, num_frames: int, track_in_reverse: bool
    ) -> Hashable:
        """What a step on frame_idx reads from the bank: objects whose keys are equal, of one video or of
        several, take the step as one batch, their banks stacked (StackedMemoryBanks)."""

    def track_step(
        self,
        frame_idx: int,
        is_init_cond_frame: bool,
        current_vision_feats: list[torch.Tensor],
        current_vision_pos_embeds: list[torch.Tensor],
        feat_sizes: list[tuple[int, int]],
        point_inputs: dict | None,
        mask_inputs: torch.Tensor | None,
        output_dict: MemoryBank | StackedMemoryBanks,
        num_frames: int,
        track_in_reverse: bool = False,
        run_mem_encoder: bool = True,
        prev_sam_mask_logits: torch.Tensor | None = None,
    ) -> FrameOutput:
        """One step on one frame for one object or a batch: its masks and object pointer read from the
        bank's memory (or the prompt alone on an initial conditioning frame) and, with run_mem_encoder,
        the frame's new memory. point_inputs {"point_coords" (B, P, 2) in the image_size frame,
        "point_labels" (B, P)}; mask_inputs (B, 1, image_size, image_size); prev_sam_mask_logits: the
        frame's earlier low-res logits, given with correction clicks."""

    def encode_memory(
        self,
        current_vision_feats: list[torch.Tensor],
        feat_sizes: list[tuple[int, int]],
        pred_masks_high_res: torch.Tensor,
        object_score_logits: torch.Tensor,
        is_mask_from_pts: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A frame's memory from its features and (B, 1, image_size, image_size) mask logits: (the
        memory features, their positional encodings), as FrameOutput.maskmem_* holds them."""

    def non_overlapping_masks(self, pred_masks: torch.Tensor) -> torch.Tensor:
        """The (objects, 1, h, w) logits of a frame with each pixel kept for its highest-scoring object only."""

    def use_input_size(self, size: int) -> None:
        """Take size x size frames instead of image_size (the video task's small CPU inputs): image_size
        and whatever else depends on it follow."""
