"""One object's memory over a video: its outputs per frame, and which of them the next frame attends to.

sam2 keeps, per object, two dicts of frame outputs: "cond_frame_outputs" (frames given prompts:
always in memory) and "non_cond_frame_outputs" (frames tracked from memory). MemoryBank is those
two dicts under the same names, plus the selection rules sam2's _prepare_memory_conditioned_features
applies to them (which conditioning frames, which recent memories, which object pointers). The
tracker reads memory only through select_cond_frames, recent_memories and recent_pointers.
StackedMemoryBanks offers the same three readers over several objects' banks, so that objects whose
steps read the same frames in the same roles take one batched step.

Like sam2's, the bank grows by one entry per tracked frame and never evicts: the predictor also
looks up a frame's earlier output in it (correction clicks, consolidating objects). What a step
reads has a fixed capacity all the same: the selected conditioning frames, at most num_maskmem - 1
recent memories and max_obj_ptrs_in_encoder - 1 recent pointers. With fixed_capacity_memory (the
compile switch) the tracker pads what the three readers pick to that capacity and masks the padding
out of the cross-attention (samfast.sam2.tracker SAM2Tracking._at_fixed_capacity), so a compiled
memory attention sees one shape from the first tracked frame on. Not built: preallocated per-object
rings of those memories and pointers that a step reads in place, instead of concatenating the picks
into a new memory tensor each step; they would live in this class, the readers keeping their meaning.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import torch

# the mask logit of an absent object, and of an object with no output on a frame yet (sam2's NO_OBJ_SCORE)
NO_OBJ_SCORE = -1024.0


@dataclass
class FrameOutput:
    """One object's result on one frame (sam2's current_out dict, as attributes).

    The bank keeps the compact form (pred_masks, obj_ptr, object_score_logits and the memory);
    the full-resolution logits and the prompts are only in what track_step returns.
    """

    pred_masks: torch.Tensor  # (B, 1, 256, 256) low-resolution mask logits
    obj_ptr: torch.Tensor  # (B, C) object pointer
    object_score_logits: torch.Tensor  # (B, 1), > 0: the object is in the frame
    maskmem_features: torch.Tensor | None = None  # (B, 64, 64, 64) the frame's memory; None: not encoded yet
    maskmem_pos_enc: list[torch.Tensor] | None = None
    pred_masks_high_res: torch.Tensor | None = None  # (B, 1, 1024, 1024)
    point_inputs: dict | None = None
    mask_inputs: torch.Tensor | None = None

    def split(self, sizes: list[int] | None = None) -> list[FrameOutput]:
        """The compact output of a batch of objects in parts of `sizes` objects (default: one output
        per object), views of its tensors; a single part is the output itself."""
        if sizes is None:
            sizes = [1] * self.pred_masks.size(0)
        if len(sizes) == 1:
            return [self]
        starts = itertools.accumulate(sizes[:-1], initial=0)
        return [
            FrameOutput(
                pred_masks=self.pred_masks[i : i + n],
                obj_ptr=self.obj_ptr[i : i + n],
                object_score_logits=self.object_score_logits[i : i + n],
                maskmem_features=None if self.maskmem_features is None else self.maskmem_features[i : i + n],
                maskmem_pos_enc=None if self.maskmem_pos_enc is None else [x[i : i + n] for x in self.maskmem_pos_enc],
            )
            for i, n in zip(starts, sizes)
        ]


class MemoryBank:
    def __init__(self) -> None:
        self.cond_frame_outputs: dict[int, FrameOutput] = {}  # frames with prompts
        self.non_cond_frame_outputs: dict[int, FrameOutput] = {}  # frames tracked from memory

    def storage(self, is_cond: bool) -> dict[int, FrameOutput]:
        return self.cond_frame_outputs if is_cond else self.non_cond_frame_outputs

    def get(self, frame_idx: int) -> FrameOutput | None:
        """The frame's output, a conditioning one first."""
        out = self.cond_frame_outputs.get(frame_idx)
        return out if out is not None else self.non_cond_frame_outputs.get(frame_idx)

    def clear(self) -> None:
        self.cond_frame_outputs.clear()
        self.non_cond_frame_outputs.clear()

    def __iter__(self) -> Iterator[tuple[bool, dict[int, FrameOutput]]]:
        """(is_cond, outputs): the non-conditioning outputs first, as sam2 walks them."""
        yield False, self.non_cond_frame_outputs
        yield True, self.cond_frame_outputs

    # --- what the tracker reads

    def select_cond_frames(
        self, frame_idx: int, max_cond_frame_num: int
    ) -> tuple[dict[int, FrameOutput], dict[int, FrameOutput]]:
        """(selected, unselected) conditioning frames: all of them when max_cond_frame_num is -1
        or not exceeded; else the closest before frame_idx, the closest at or after it, then the
        closest others (sam2's select_closest_cond_frames)."""
        cond = self.cond_frame_outputs
        if max_cond_frame_num == -1 or len(cond) <= max_cond_frame_num:
            return cond, {}
        if max_cond_frame_num < 2:
            raise ValueError("max_cond_frames_in_attn must allow 2 or more conditioning frames (or be -1)")
        selected = {}
        idx_before = max((t for t in cond if t < frame_idx), default=None)
        if idx_before is not None:
            selected[idx_before] = cond[idx_before]
        idx_after = min((t for t in cond if t >= frame_idx), default=None)
        if idx_after is not None:
            selected[idx_after] = cond[idx_after]
        num_remain = max_cond_frame_num - len(selected)
        inds_remain = sorted((t for t in cond if t not in selected), key=lambda x: abs(x - frame_idx))[:num_remain]
        selected.update((t, cond[t]) for t in inds_remain)
        return selected, {t: v for t, v in cond.items() if t not in selected}

    def recent_memories(
        self,
        frame_idx: int,
        num_maskmem: int,
        stride: int,
        track_in_reverse: bool,
        unselected_cond: dict[int, FrameOutput],
    ) -> list[tuple[int, FrameOutput]]:
        """(temporal position, output) of the num_maskmem - 1 memories before frame_idx (after it
        when tracking in reverse): position num_maskmem - 1 is the previous frame, the others every
        stride-th frame further away. A conditioning frame left out of the selection counts here
        as a tracked one; frames without an output are skipped."""
        memories = []
        for t_pos in range(1, num_maskmem):
            t_rel = num_maskmem - t_pos  # frames away from frame_idx
            if t_rel == 1:  # always the adjacent frame, whatever the stride
                prev_frame_idx = frame_idx + t_rel if track_in_reverse else frame_idx - t_rel
            elif not track_in_reverse:
                # the nearest stride-th frame before frame_idx - 1, then further stride-th frames
                prev_frame_idx = ((frame_idx - 2) // stride) * stride
                prev_frame_idx = prev_frame_idx - (t_rel - 2) * stride
            else:
                prev_frame_idx = -(-(frame_idx + 2) // stride) * stride
                prev_frame_idx = prev_frame_idx + (t_rel - 2) * stride
            out = self.non_cond_frame_outputs.get(prev_frame_idx)
            if out is None:
                out = unselected_cond.get(prev_frame_idx)
            if out is not None:
                memories.append((t_pos, out))
        return memories

    def recent_pointers(
        self,
        frame_idx: int,
        max_obj_ptrs: int,
        num_frames: int,
        track_in_reverse: bool,
        unselected_cond: dict[int, FrameOutput],
    ) -> list[tuple[int, FrameOutput]]:
        """(distance, output) of the tracked frames among the max_obj_ptrs - 1 before frame_idx
        (after it in reverse), nearest first, stopping at the video's ends."""
        pointers = []
        for t_diff in range(1, max_obj_ptrs):
            t = frame_idx + t_diff if track_in_reverse else frame_idx - t_diff
            if t < 0 or (num_frames is not None and t >= num_frames):
                break
            out = self.non_cond_frame_outputs.get(t, unselected_cond.get(t))
            if out is not None:
                pointers.append((t_diff, out))
        return pointers


class StackedFrameOutput:
    """Several objects' outputs on one frame as one batch (dim 0), for the tracker: what it reads
    (the memory, its positional encoding, the object pointer) is stacked when first read, so a
    frame read only for its pointer stacks only the pointers."""

    def __init__(self, outputs: list[FrameOutput]) -> None:
        self.outputs = outputs

    @cached_property
    def obj_ptr(self) -> torch.Tensor:
        return _stacked([out.obj_ptr for out in self.outputs])

    @cached_property
    def maskmem_features(self) -> torch.Tensor:
        return _stacked([out.maskmem_features for out in self.outputs])

    @cached_property
    def maskmem_pos_enc(self) -> list[torch.Tensor]:
        return [_stacked(list(levels)) for levels in zip(*(out.maskmem_pos_enc for out in self.outputs))]


def _stacked(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts concatenated on dim 0: a view where they already lie so in one tensor (the objects of one
    batched step, split per object by FrameOutput.split, or the one encoding the predictor expands to
    every object), else a copy. Each step re-stacks the 7 memory frames it reads, so copies there cost
    every frame (docs/measurements/video/video-memory-gather-h200-2026-11-28.md)."""
    first = parts[0]
    offset = first.storage_offset()
    for part in parts:
        same_layout = (part.dtype, part.stride(), part.shape[1:]) == (first.dtype, first.stride(), first.shape[1:])
        same_memory = part.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not (same_layout and same_memory and part.storage_offset() == offset):
            return torch.cat(parts)
        offset += part.shape[0] * part.stride(0)
    rows = sum(part.shape[0] for part in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


class StackedMemoryBanks:
    """Several objects' banks read by the tracker as one batch: each reader asks every bank and
    stacks the outputs they pick. The banks must pick the same frames in the same roles on the
    frame (equal memory_selection_key, how the predictor groups objects); otherwise an error.

    select_cond_frames returns each bank's own unselected conditioning frames (a list, one per
    bank), which the tracker only hands back to recent_memories and recent_pointers.
    """

    def __init__(self, banks: list[MemoryBank]) -> None:
        self.banks = banks

    def select_cond_frames(
        self, frame_idx: int, max_cond_frame_num: int
    ) -> tuple[dict[int, StackedFrameOutput], list[dict[int, FrameOutput]]]:
        picks = [bank.select_cond_frames(frame_idx, max_cond_frame_num) for bank in self.banks]
        selected = _stack_pairs([list(selected.items()) for selected, _ in picks])
        return dict(selected), [unselected for _, unselected in picks]

    def recent_memories(
        self,
        frame_idx: int,
        num_maskmem: int,
        stride: int,
        track_in_reverse: bool,
        unselected_cond: list[dict[int, FrameOutput]],
    ) -> list[tuple[int, StackedFrameOutput]]:
        return _stack_pairs(
            [
                bank.recent_memories(frame_idx, num_maskmem, stride, track_in_reverse, unselected)
                for bank, unselected in zip(self.banks, unselected_cond)
            ]
        )

    def recent_pointers(
        self,
        frame_idx: int,
        max_obj_ptrs: int,
        num_frames: int,
        track_in_reverse: bool,
        unselected_cond: list[dict[int, FrameOutput]],
    ) -> list[tuple[int, StackedFrameOutput]]:
        return _stack_pairs(
            [
                bank.recent_pointers(frame_idx, max_obj_ptrs, num_frames, track_in_reverse, unselected)
                for bank, unselected in zip(self.banks, unselected_cond)
            ]
        )


def _stack_pairs(picks_per_bank: list[list[tuple[int, FrameOutput]]]) -> list[tuple[int, StackedFrameOutput]]:
    """Every bank's (key, output) picks (key: a frame, a temporal position or a distance) as one
    list of (key, stacked output)."""
    keys = [key for key, _ in picks_per_bank[0]]
    if any([key for key, _ in picks] != keys for picks in picks_per_bank[1:]):
        raise ValueError("the stacked banks pick different memories: group objects by memory_selection_key")
    return [(key, StackedFrameOutput([picks[i][1] for picks in picks_per_bank])) for i, key in enumerate(keys)]
