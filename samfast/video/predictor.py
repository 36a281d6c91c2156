"""VideoPredictor: prompts on some frames of a video, masks of every object on every frame.

sam2's SAM2VideoPredictor (sam2_video_predictor.py) with its methods, arguments and outputs:
init_state, add_new_points_or_box, add_new_mask, propagate_in_video, clear_all_prompts_in_frame,
remove_object, reset_state. It runs sam2's steps in sam2's order, so with the same weights its
fp32 masks are sam2's. Unlike sam2's (a subclass of the model), it holds the model: any tracker
of SAM 2's design serves it (SAM 2's SAM2Base; SAM 3's tracker, whose step is the same), through
the public methods of the samfast.video.Tracker protocol only.

How it runs, as in sam2: a prompt runs the tracking step on its frame for its object only, without
encoding the frame's memory, and keeps the result as pending; propagate_in_video first encodes the
pending results into memory, then tracks each object frame by frame from its memory bank. Each
frame's image features are computed once for all objects. Unlike sam2 (one object at a time), the
objects whose steps on a frame read the same memory selection (the same conditioning frames, recent
memories and pointers: objects prompted on the same frames and tracked together) take one step as a
batch, the frame's features expanded to it and their memories stacked, and each object's output goes
back to its own bank; objects with other selections form their own batches. Likewise the pending
results of the objects prompted on one frame have their memories encoded in one batch. The batch
changes only the float rounding of the batched matmuls (tests/unit/test_sam2_video.py says how much).
propagate_in_videos tracks several videos' states in one call, batching the objects of different
videos on the same frame as those of one video (propagate_in_video is its one-video case). With
frames_per_encode > 1 a propagation encodes the frames it is about to track in batches of that many
(fuller image-encoder calls; tests/unit/test_frames_per_encode.py).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from samfast.transfer import to_device
from samfast.video.frames import VideoSource, load_video_frames
from samfast.video.memory_bank import NO_OBJ_SCORE, FrameOutput, MemoryBank, StackedMemoryBanks
from samfast.video.tracker import FRAME_FEATURE_KEYS, Tracker


@dataclass
class ObjectTrack:
    """One object's prompts and results (sam2 keeps them in per-object dicts keyed by the object's index)."""

    obj_id: Hashable
    point_inputs_per_frame: dict[int, dict] = field(default_factory=dict)
    mask_inputs_per_frame: dict[int, torch.Tensor] = field(default_factory=dict)
    memory: MemoryBank = field(default_factory=MemoryBank)  # sam2's output_dict_per_obj[obj_idx]
    # results of prompts given since the last propagation, their memory not encoded yet
    # (sam2's temp_output_dict_per_obj[obj_idx])
    pending: MemoryBank = field(default_factory=MemoryBank)
    frames_tracked: dict[int, dict] = field(default_factory=dict)  # frame -> {"reverse": direction it was tracked in}

    def clear(self) -> None:
        self.point_inputs_per_frame.clear()
        self.mask_inputs_per_frame.clear()
        self.memory.clear()
        self.pending.clear()
        self.frames_tracked.clear()


@dataclass
class InferenceState:
    """One video's frames and tracking state (sam2's inference_state dict; `state["num_frames"]`
    and the other keys sam2 users read work too)."""

    images: torch.Tensor  # (T, 3, S, S) normalized frames
    video_height: int
    video_width: int
    device: torch.device
    storage_device: torch.device  # where results and memories are kept (the CPU with offload_state_to_cpu)
    offload_video_to_cpu: bool = False
    offload_state_to_cpu: bool = False
    objects: list[ObjectTrack] = field(default_factory=list)  # in the order they were added: obj_idx
    # image features {frame_idx: backbone_out}: the latest frame's, for repeated prompts on it, or those
    # of the frames encoded ahead of tracking (VideoPredictor.frames_per_encode)
    cached_features: dict = field(default_factory=dict)
    # the frames a running propagation tracks next, in its order: what the encoder may take ahead
    upcoming: list[int] = field(default_factory=list)
    # the memories' positional encoding, the same for every frame and object: one copy
    maskmem_pos_enc: list[torch.Tensor] | None = None

    @property
    def num_frames(self) -> int:
        return len(self.images)

    @property
    def obj_ids(self) -> list:
        return [obj.obj_id for obj in self.objects]

    def obj_idx(self, obj_id: Hashable) -> int | None:
        return next((i for i, obj in enumerate(self.objects) if obj.obj_id == obj_id), None)

    def __getitem__(self, key: str):
        return getattr(self, key)


def fill_holes_in_mask_scores(mask: torch.Tensor, max_area: int) -> torch.Tensor:
    """sam2's hole filling (background components of at most max_area pixels set to 0.1) needs
    connected components from its CUDA extension; without it sam2 warns and returns the mask as
    it is. The sam2 that samfast's SAM 2 is gated against is installed without it (SAM2_BUILD_CUDA=0),
    so samfast does what that sam2 does (samfast.modeling.connected_components, which SAM 3's
    predict_inst fills with, would fill them; nothing here compares that with sam2's extension yet)."""
    if max_area <= 0:
        raise ValueError("max_area must be positive")
    warnings.warn(
        "fill_hole_area > 0: skipping the hole filling, as sam2 does without its CUDA extension (the sam2 "
        "samfast's SAM 2 is checked against); the masks are otherwise unchanged.",
        category=UserWarning,
        stacklevel=2,
    )
    return mask


class VideoPredictor:
    def __init__(
        self,
        model: Tracker,
        fill_hole_area: int = 0,
        non_overlap_masks: bool = False,
        clear_non_cond_mem_around_input: bool = False,
        add_all_frames_to_correct_as_cond: bool = False,
        frames_per_encode: int = 1,
    ) -> None:
        """model: a samfast.video.Tracker (SAM 2's: samfast.sam2.SAM2Base). fill_hole_area: see fill_holes_in_mask_scores
        (warned and skipped). non_overlap_masks: keep only the highest-scoring object per pixel in
        the returned masks. clear_non_cond_mem_around_input: a correction click drops the object's
        tracked memories within num_maskmem frames of it. add_all_frames_to_correct_as_cond: a
        correction on a tracked frame makes it a conditioning frame too. frames_per_encode: while
        propagating, the image encoder takes this many of the frames about to be tracked in one
        batch (1: one frame a call, as sam2; more: fewer, fuller encoder calls, the features of the
        frames ahead kept until tracked; the batch changes only the encoder's rounding)."""
        if frames_per_encode < 1:
            raise ValueError(f"frames_per_encode must be at least 1 (got {frames_per_encode})")
        self.model = model
        self.frames_per_encode = frames_per_encode
        self.fill_hole_area = fill_hole_area
        self.non_overlap_masks = non_overlap_masks
        self.clear_non_cond_mem_around_input = clear_non_cond_mem_around_input
        self.add_all_frames_to_correct_as_cond = add_all_frames_to_correct_as_cond

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def image_size(self) -> int:
        return self.model.image_size

    # --- the video and its objects

    @torch.inference_mode()
    def init_state(
        self,
        video_path: VideoSource,
        offload_video_to_cpu: bool = False,
        offload_state_to_cpu: bool = False,
        async_loading_frames: bool = False,
    ) -> InferenceState:
        """A fresh state for a video: a folder of JPEG frames named by index, an .mp4 (with decord),
        a list of HxWx3 uint8 RGB frames or PIL images, or a (T, H, W, 3) uint8 array or tensor.

        offload_video_to_cpu keeps the frames on the CPU, offload_state_to_cpu the results and
        memories. async_loading_frames is accepted for sam2's signature; frames load up front
        (the same frames, so the same results). Frame 0's features are computed here, as sam2 does.
        """
        del async_loading_frames
        compute_device = self.device
        images, video_height, video_width = load_video_frames(
            video_path, self.image_size, offload_video_to_cpu, compute_device
        )
        state = InferenceState(
            images=images,
            video_height=video_height,
            video_width=video_width,
            device=compute_device,
            storage_device=torch.device("cpu") if offload_state_to_cpu else compute_device,
            offload_video_to_cpu=offload_video_to_cpu,
            offload_state_to_cpu=offload_state_to_cpu,
        )
        self._frame_backbone_out(state, frame_idx=0)  # the first frame's features, ready for its prompts
        return state

    def _obj_id_to_idx(self, inference_state: InferenceState, obj_id: Hashable) -> int:
        """The object's index, a new object added (at any time, after tracking started too) for a new id."""
        obj_idx = inference_state.obj_idx(obj_id)
        if obj_idx is None:
            inference_state.objects.append(ObjectTrack(obj_id))
            obj_idx = len(inference_state.objects) - 1
        return obj_idx

    def _obj_idx_to_id(self, inference_state: InferenceState, obj_idx: int) -> Hashable:
        return inference_state.objects[obj_idx].obj_id

    def _get_obj_num(self, inference_state: InferenceState) -> int:
        return len(inference_state.objects)

    # --- prompts

    @torch.inference_mode()
    def add_new_points_or_box(
        self,
        inference_state: InferenceState,
        frame_idx: int,
        obj_id: Hashable,
        points=None,
        labels=None,
        clear_old_points: bool = True,
        normalize_coords: bool = True,
        box=None,
    ) -> tuple[int, list, torch.Tensor]:
        """Clicks (points (N, 2) x, y and labels (N,): 1 foreground, 0 background) and/or a box
        (x0, y0, x1, y1) for one object on one frame: (frame_idx, obj_ids, video_res_masks
        (num objects, 1, H, W) logits of every object on that frame).

        Coordinates are in pixels of the video (in [0, 1] with normalize_coords=False). With
        clear_old_points=False the points add to the frame's earlier ones (a box cannot: it must
        come first). On a frame the object was already tracked on, the clicks correct that result.
        """
        obj_idx = self._obj_id_to_idx(inference_state, obj_id)
        obj = inference_state.objects[obj_idx]

        if (points is not None) != (labels is not None):
            raise ValueError("points and labels must be provided together")
        if points is None and box is None:
            raise ValueError("at least one of points or box must be provided as input")
        if points is None:
            points = torch.zeros(0, 2, dtype=torch.float32)
        elif not isinstance(points, torch.Tensor):
            points = torch.tensor(points, dtype=torch.float32)
        if labels is None:
            labels = torch.zeros(0, dtype=torch.int32)
        elif not isinstance(labels, torch.Tensor):
            labels = torch.tensor(labels, dtype=torch.int32)
        if points.dim() == 2:
            points = points.unsqueeze(0)  # the batch of one object
        if labels.dim() == 1:
            labels = labels.unsqueeze(0)

        if box is not None:
            # a box is its two corners, labelled 2 and 3, in front of the points (how SAM 2 is trained)
            if not clear_old_points:
                raise ValueError(
                    "cannot add box without clearing old points, since box prompt must be provided before any "
                    "point prompt (please use clear_old_points=True instead)"
                )
            if not isinstance(box, torch.Tensor):
                box = to_device(box, torch.float32, points.device)
            box_coords = box.reshape(1, 2, 2)
            box_labels = to_device([2, 3], torch.int32, labels.device).reshape(1, 2)
            points = torch.cat([box_coords, points], dim=1)
            labels = torch.cat([box_labels, labels], dim=1)

        if normalize_coords:
            video_H, video_W = inference_state.video_height, inference_state.video_width
            points = points / to_device([video_W, video_H], torch.int64, points.device)
        points = points * self.image_size  # to the model's S x S input frame
        points = points.to(inference_state.device)
        labels = labels.to(inference_state.device)

        point_inputs = obj.point_inputs_per_frame.get(frame_idx) if not clear_old_points else None
        point_inputs = concat_points(point_inputs, points, labels)
        obj.point_inputs_per_frame[frame_idx] = point_inputs
        obj.mask_inputs_per_frame.pop(frame_idx, None)

        is_init_cond_frame, reverse, is_cond = self._prompted_frame_role(obj, frame_idx)
        # the frame's latest logits go to the decoder with the new clicks: the pending result
        # first, else the tracked one
        prev_sam_mask_logits = None
        prev_out = obj.pending.storage(is_cond).get(frame_idx)
        if prev_out is None:
            prev_out = obj.memory.get(frame_idx)
        if prev_out is not None and prev_out.pred_masks is not None:
            prev_sam_mask_logits = prev_out.pred_masks.to(inference_state.device, non_blocking=True)
            prev_sam_mask_logits = torch.clamp(prev_sam_mask_logits, -32.0, 32.0)  # avoids rare numerical issues
        current_out, _ = self._run_single_frame_inference(
            inference_state=inference_state,
            output_dict=obj.memory,
            frame_idx=frame_idx,
            batch_size=1,
            is_init_cond_frame=is_init_cond_frame,
            point_inputs=point_inputs,
            mask_inputs=None,
            reverse=reverse,
            # the memory is encoded when propagation starts, once every object's prompts are in
            run_mem_encoder=False,
            prev_sam_mask_logits=prev_sam_mask_logits,
        )
        obj.pending.storage(is_cond)[frame_idx] = current_out
        return frame_idx, inference_state.obj_ids, self._frame_masks_at_video_res(inference_state, frame_idx, is_cond)

    def add_new_points(self, *args, **kwargs):
        """sam2's deprecated name of add_new_points_or_box."""
        return self.add_new_points_or_box(*args, **kwargs)

    @torch.inference_mode()
    def add_new_mask(
        self, inference_state: InferenceState, frame_idx: int, obj_id: Hashable, mask
    ) -> tuple[int, list, torch.Tensor]:
        """A (H, W) bool mask of one object on one frame, taken as that frame's result:
        (frame_idx, obj_ids, video_res_masks) as add_new_points_or_box returns them."""
        obj_idx = self._obj_id_to_idx(inference_state, obj_id)
        obj = inference_state.objects[obj_idx]

        if not isinstance(mask, torch.Tensor):
            mask = torch.tensor(np.asarray(mask), dtype=torch.bool)
        if mask.dim() != 2:
            raise ValueError(f"add_new_mask takes one (H, W) mask, got shape {tuple(mask.shape)}")
        mask_H, mask_W = mask.shape
        mask_inputs_orig = mask[None, None].float().to(inference_state.device)
        if mask_H != self.image_size or mask_W != self.image_size:
            mask_inputs = F.interpolate(
                mask_inputs_orig,
                size=(self.image_size, self.image_size),
                align_corners=False,
                mode="bilinear",
                antialias=True,  # downsampling
            )
            mask_inputs = (mask_inputs >= 0.5).float()
        else:
            mask_inputs = mask_inputs_orig

        obj.mask_inputs_per_frame[frame_idx] = mask_inputs
        obj.point_inputs_per_frame.pop(frame_idx, None)
        is_init_cond_frame, reverse, is_cond = self._prompted_frame_role(obj, frame_idx)
        current_out, _ = self._run_single_frame_inference(
            inference_state=inference_state,
            output_dict=obj.memory,
            frame_idx=frame_idx,
            batch_size=1,
            is_init_cond_frame=is_init_cond_frame,
            point_inputs=None,
            mask_inputs=mask_inputs,
            reverse=reverse,
            run_mem_encoder=False,
        )
        obj.pending.storage(is_cond)[frame_idx] = current_out
        return frame_idx, inference_state.obj_ids, self._frame_masks_at_video_res(inference_state, frame_idx, is_cond)

    def _prompted_frame_role(self, obj: ObjectTrack, frame_idx: int) -> tuple[bool, bool, bool]:
        """(is_init_cond_frame, reverse, is_cond) of a prompt on a frame.

        A frame the object was not tracked on is an initial conditioning frame, segmented without
        memory like an image; on a tracked frame the prompt corrects the result, read with the
        memory of the direction it was tracked in, and stays a non-conditioning frame unless
        add_all_frames_to_correct_as_cond.
        """
        is_init_cond_frame = frame_idx not in obj.frames_tracked
        reverse = False if is_init_cond_frame else obj.frames_tracked[frame_idx]["reverse"]
        is_cond = is_init_cond_frame or self.add_all_frames_to_correct_as_cond
        return is_init_cond_frame, reverse, is_cond

    # --- outputs across objects

    def _frame_masks_at_video_res(self, inference_state: InferenceState, frame_idx: int, is_cond: bool) -> torch.Tensor:
        """Every object's logits on a prompted frame, at the video's resolution."""
        consolidated = self._consolidate_temp_output_across_obj(inference_state, frame_idx, is_cond)
        return self._get_orig_video_res_output(inference_state, consolidated)

    def _get_orig_video_res_output(self, inference_state: InferenceState, any_res_masks: torch.Tensor) -> torch.Tensor:
        """Mask logits (num objects, 1, h, w) resized to the video's resolution (and made
        non-overlapping with non_overlap_masks)."""
        video_H, video_W = inference_state.video_height, inference_state.video_width
        any_res_masks = any_res_masks.to(inference_state.device, non_blocking=True)
        if any_res_masks.shape[-2:] == (video_H, video_W):
            video_res_masks = any_res_masks
        else:
            video_res_masks = F.interpolate(any_res_masks, size=(video_H, video_W), mode="bilinear", align_corners=False)
        if self.non_overlap_masks:
            video_res_masks = self.model.non_overlapping_masks(video_res_masks)
        return video_res_masks

    def _consolidate_temp_output_across_obj(
        self, inference_state: InferenceState, frame_idx: int, is_cond: bool
    ) -> torch.Tensor:
        """(num objects, 1, H, W) logits of every object on a frame at the video's resolution: its
        pending result, else its tracked one, else NO_OBJ_SCORE (sam2's consolidate_at_video_res)."""
        batch_size = self._get_obj_num(inference_state)
        consolidated_pred_masks = torch.full(
            size=(batch_size, 1, inference_state.video_height, inference_state.video_width),
            fill_value=NO_OBJ_SCORE,
            dtype=torch.float32,
            device=inference_state.storage_device,
        )
        for obj_idx, obj in enumerate(inference_state.objects):
            out = obj.pending.storage(is_cond).get(frame_idx)
            if out is None:
                out = obj.memory.get(frame_idx)
            if out is None:
                continue
            obj_mask = out.pred_masks
            if obj_mask.shape[-2:] == consolidated_pred_masks.shape[-2:]:
                consolidated_pred_masks[obj_idx : obj_idx + 1] = obj_mask
            else:
                consolidated_pred_masks[obj_idx : obj_idx + 1] = F.interpolate(
                    obj_mask, size=consolidated_pred_masks.shape[-2:], mode="bilinear", align_corners=False
                )
        return consolidated_pred_masks

    # --- propagation

    @torch.inference_mode()
    def propagate_in_video_preflight(self, inference_state: InferenceState) -> None:
        """Encode the memory of every pending prompt result (one batch per frame) and move it into the
        object's bank."""
        self._preflight([inference_state])

    def _preflight(self, states: list[InferenceState]) -> None:
        """propagate_in_video_preflight for several videos, the pending results on one frame of every
        video encoded in one batch."""
        for state in states:
            if self._get_obj_num(state) == 0:
                raise RuntimeError("No input points or masks are provided for any object; please add inputs first.")
        self._encode_pending_memories(states)
        for state in states:
            self._move_pending_into_memory(state)

    def _move_pending_into_memory(self, inference_state: InferenceState) -> None:
        for obj_idx, obj in enumerate(inference_state.objects):
            for is_cond, pending in obj.pending:
                for frame_idx, out in pending.items():
                    obj.memory.storage(is_cond)[frame_idx] = out
                    if self.clear_non_cond_mem_around_input:
                        self._clear_obj_non_cond_mem_around_input(inference_state, frame_idx, obj_idx)
                pending.clear()
            if len(obj.memory.cond_frame_outputs) == 0:
                raise RuntimeError(
                    f"No input points or masks are provided for object id {obj.obj_id}; please add inputs first."
                )
            # a frame that became a conditioning frame is no longer a tracked one
            for frame_idx in obj.memory.cond_frame_outputs:
                obj.memory.non_cond_frame_outputs.pop(frame_idx, None)

    def _encode_pending_memories(self, states: list[InferenceState]) -> None:
        """Encode the memory of every pending prompt result that has none, the objects' results on
        one frame (of every video) in one batch (sam2 encodes them one object at a time): one
        memory-encoder call per prompted frame, at the batch the tracked frames use when the objects
        were prompted together (one compiled graph for both)."""
        pending_per_frame: dict[int, list[tuple[int, FrameOutput]]] = {}
        for video, state in enumerate(states):
            for obj in state.objects:
                for _, pending in obj.pending:
                    for frame_idx, out in pending.items():
                        if out.maskmem_features is None:
                            pending_per_frame.setdefault(frame_idx, []).append((video, out))
        for frame_idx, members in sorted(pending_per_frame.items()):
            batches = [members] if self.model.batches_objects else [[member] for member in members]
            for batch in batches:
                self._encode_prompted_memories(states, frame_idx, batch)

    def _encode_prompted_memories(
        self, states: list[InferenceState], frame_idx: int, members: list[tuple[int, FrameOutput]]
    ) -> None:
        """The memories of prompt results on one frame ((video, output) of one object each, each
        video's together), encoded as one batch and handed back to each result."""
        per_video = _by_video(states, members)
        outs = [out for _, out in members]
        low_res_masks = torch.cat([out.pred_masks.to(per_video[0][0].device) for out in outs])
        high_res_masks = F.interpolate(
            low_res_masks, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False
        )
        memories = self._run_memory_encoder(
            [(state, len(video_outs)) for state, video_outs in per_video],
            frame_idx,
            high_res_masks=high_res_masks,
            object_score_logits=torch.cat([out.object_score_logits for out in outs]),
            is_mask_from_pts=True,  # frames the user prompted
        )
        for (_, video_outs), (maskmem_features, maskmem_pos_enc) in zip(per_video, memories):
            for i, out in enumerate(video_outs):
                out.maskmem_features = maskmem_features[i : i + 1]
                out.maskmem_pos_enc = [x[i : i + 1] for x in maskmem_pos_enc]

    @torch.inference_mode()
    def propagate_in_video(
        self,
        inference_state: InferenceState,
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[int, list, torch.Tensor]]:
        """Track every object through the video: yields (frame_idx, obj_ids, video_res_masks
        (num objects, 1, H, W) logits) frame by frame, from start_frame_idx (default: the first
        prompted frame) for max_frame_num_to_track more frames (default: to the end), backwards
        with reverse. Prompted frames give their prompt's result."""
        for _, frame_idx, obj_ids, video_res_masks in self.propagate_in_videos(
            [inference_state], start_frame_idx, max_frame_num_to_track, reverse
        ):
            yield frame_idx, obj_ids, video_res_masks

    @torch.inference_mode()
    def propagate_in_videos(
        self,
        inference_states: Sequence[InferenceState],
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[int, int, list, torch.Tensor]]:
        """Track every object of several videos in one call (sam2 issue #399): yields (video, frame_idx,
        obj_ids, video_res_masks), video the state's index in inference_states, the rest as
        propagate_in_video yields them for that video. Each video tracks the frames propagate_in_video
        would (start_frame_idx None: the video's own first prompted frame; an int: the same frame in
        every video); they go frame index by frame index (descending with reverse), the videos on a
        frame in their order, so that the objects of different videos on the same frame whose steps read
        the same memory selection take one batched step, as the objects of one video do: videos prompted
        on the same frames take one step per frame for all their objects. Each video's outputs are those
        of tracking it alone but for the batch's rounding (tests/unit/test_video_many.py)."""
        states = list(inference_states)
        if len({id(state) for state in states}) < len(states):
            raise ValueError("propagate_in_videos takes each video's state once")
        self._preflight(states)
        orders = [self._processing_order(state, start_frame_idx, max_frame_num_to_track, reverse) for state in states]
        obj_ids = [state.obj_ids for state in states]
        for state, order in zip(states, orders):
            state.upcoming = list(order)
        try:
            for frame_idx in sorted(set().union(*orders), reverse=reverse):
                videos = [video for video, order in enumerate(orders) if frame_idx in order]
                all_pred_masks = self._propagate_frame([states[video] for video in videos], frame_idx, reverse)
                for video, pred_masks in zip(videos, all_pred_masks):
                    yield video, frame_idx, obj_ids[video], self._get_orig_video_res_output(states[video], pred_masks)
        finally:  # also when the caller stops early: a later prompt encodes its own frame only
            for state in states:
                state.upcoming = []

    def _processing_order(
        self, inference_state: InferenceState, start_frame_idx: int | None, max_frame_num_to_track: int | None, reverse: bool
    ) -> range:
        """The frames propagate_in_video tracks, in its order."""
        num_frames = inference_state.num_frames
        if start_frame_idx is None:
            start_frame_idx = min(t for obj in inference_state.objects for t in obj.memory.cond_frame_outputs)
        if max_frame_num_to_track is None:
            max_frame_num_to_track = num_frames
        if reverse:
            end_frame_idx = max(start_frame_idx - max_frame_num_to_track, 0)
            # nothing to track backwards from frame 0
            return range(start_frame_idx, end_frame_idx - 1, -1) if start_frame_idx > 0 else range(0)
        end_frame_idx = min(start_frame_idx + max_frame_num_to_track, num_frames - 1)
        return range(start_frame_idx, end_frame_idx + 1)

    def _propagate_frame(self, states: list[InferenceState], frame_idx: int, reverse: bool) -> list[torch.Tensor]:
        """One frame of each state's video: per video, every object's (num objects, 1, h, w) low-res
        logits, a prompted object's from its prompt, the others tracked in groups across the videos."""
        pred_masks_per_obj = [[None] * self._get_obj_num(state) for state in states]
        to_track = []  # (video, obj_idx)
        for video, state in enumerate(states):
            for obj_idx, obj in enumerate(state.objects):
                if frame_idx in obj.memory.cond_frame_outputs:
                    # a prompted frame: its result is already there (prompts differ per object,
                    # so these are not rerun)
                    pred_masks = obj.memory.cond_frame_outputs[frame_idx].pred_masks
                    pred_masks_per_obj[video][obj_idx] = pred_masks.to(state.device, non_blocking=True)
                    if self.clear_non_cond_mem_around_input:
                        self._clear_obj_non_cond_mem_around_input(state, frame_idx, obj_idx)
                else:
                    to_track.append((video, obj_idx))
        for group in self._group_by_memory_selection(states, to_track, frame_idx, reverse):
            pred_masks = self._track_group(states, group, frame_idx, reverse)
            for i, (video, obj_idx) in enumerate(group):
                pred_masks_per_obj[video][obj_idx] = pred_masks[i : i + 1]
        for state in states:
            for obj in state.objects:
                obj.frames_tracked[frame_idx] = {"reverse": reverse}
        return [torch.cat(masks, dim=0) if len(masks) > 1 else masks[0] for masks in pred_masks_per_obj]

    def _group_by_memory_selection(
        self, states: list[InferenceState], members: list[tuple[int, int]], frame_idx: int, reverse: bool
    ) -> list[list[tuple[int, int]]]:
        """The objects to track on a frame, (video, obj_idx) in states, grouped by what their step
        reads from memory (memory_selection_key): a group takes one batched step. Objects prompted
        on the same frames and tracked together, the common case, form one group, of one video or
        of several; a group lists its members in the order given."""
        if not self.model.batches_objects:
            return [[member] for member in members]
        groups: dict[tuple, list[tuple[int, int]]] = {}
        for video, obj_idx in members:
            state = states[video]
            key = self.model.memory_selection_key(state.objects[obj_idx].memory, frame_idx, state.num_frames, reverse)
            groups.setdefault(key, []).append((video, obj_idx))
        return list(groups.values())

    def _track_group(
        self, states: list[InferenceState], group: list[tuple[int, int]], frame_idx: int, reverse: bool
    ) -> torch.Tensor:
        """One tracking step on a frame for a group of objects whose memory selections are equal
        (members (video, obj_idx), each video's together): each video's frame features expanded to
        its objects and the videos' concatenated, the objects' memories stacked; each object's output
        goes to its own bank. The group's (N, 1, h, w) low-res logits."""
        per_video = _by_video(states, group)
        banks = [state.objects[obj_idx].memory for state, obj_indices in per_video for obj_idx in obj_indices]
        current_vision_feats, current_vision_pos_embeds, feat_sizes = self._group_image_features(
            [(state, len(obj_indices)) for state, obj_indices in per_video], frame_idx
        )
        current_out = self.model.track_step(
            frame_idx=frame_idx,
            is_init_cond_frame=False,
            current_vision_feats=current_vision_feats,
            current_vision_pos_embeds=current_vision_pos_embeds,
            feat_sizes=feat_sizes,
            point_inputs=None,
            mask_inputs=None,
            output_dict=banks[0] if len(banks) == 1 else StackedMemoryBanks(banks),
            # any of the videos' lengths: equal memory_selection_keys read the same (its docstring)
            num_frames=per_video[0][0].num_frames,
            track_in_reverse=reverse,
            run_mem_encoder=True,
        )
        pred_masks = []
        video_outs = current_out.split([len(obj_indices) for _, obj_indices in per_video])
        for (state, obj_indices), video_out in zip(per_video, video_outs):
            compact_out, video_pred_masks = self._compact_output(state, video_out)
            for obj_idx, out in zip(obj_indices, compact_out.split()):
                state.objects[obj_idx].memory.non_cond_frame_outputs[frame_idx] = out
            pred_masks.append(video_pred_masks)
        return torch.cat(pred_masks, dim=0) if len(pred_masks) > 1 else pred_masks[0]

    # --- removing prompts and objects

    @torch.inference_mode()
    def clear_all_prompts_in_frame(
        self, inference_state: InferenceState, frame_idx: int, obj_id: Hashable, need_output: bool = True
    ) -> tuple[int, list, torch.Tensor] | None:
        """Drop one object's prompts on one frame; its result there, if any, becomes a tracked
        frame's. With need_output, every object's logits on that frame as add_new_points_or_box
        returns them."""
        obj_idx = self._obj_id_to_idx(inference_state, obj_id)
        obj = inference_state.objects[obj_idx]
        obj.point_inputs_per_frame.pop(frame_idx, None)
        obj.mask_inputs_per_frame.pop(frame_idx, None)
        obj.pending.cond_frame_outputs.pop(frame_idx, None)
        obj.pending.non_cond_frame_outputs.pop(frame_idx, None)
        out = obj.memory.cond_frame_outputs.pop(frame_idx, None)
        if out is not None:
            obj.memory.non_cond_frame_outputs[frame_idx] = out
            obj.frames_tracked.pop(frame_idx, None)
        if not need_output:
            return None
        is_cond = any(frame_idx in other.pending.cond_frame_outputs for other in inference_state.objects)
        return frame_idx, inference_state.obj_ids, self._frame_masks_at_video_res(inference_state, frame_idx, is_cond)

    @torch.inference_mode()
    def reset_state(self, inference_state: InferenceState) -> None:
        """Drop every object, prompt and result (the frames and their cached features stay)."""
        self._reset_tracking_results(inference_state)
        inference_state.objects.clear()

    def _reset_tracking_results(self, inference_state: InferenceState) -> None:
        for obj in inference_state.objects:
            obj.clear()

    @torch.inference_mode()
    def remove_object(
        self, inference_state: InferenceState, obj_id: Hashable, strict: bool = False, need_output: bool = True
    ) -> tuple[list, list[tuple[int, torch.Tensor]]]:
        """Drop one object: (remaining obj_ids, [(frame_idx, video_res_masks)] of the frames it had
        prompts on, with need_output). An unknown id is ignored (strict: an error)."""
        obj_idx_to_rm = inference_state.obj_idx(obj_id)
        updated_frames = []
        if obj_idx_to_rm is None:
            if not strict:
                return inference_state.obj_ids, updated_frames
            raise RuntimeError(
                f"Cannot remove object id {obj_id} as it doesn't exist. All existing object ids: {inference_state.obj_ids}."
            )
        if self._get_obj_num(inference_state) == 1:  # the last object: a reset
            self.reset_state(inference_state)
            return inference_state.obj_ids, updated_frames

        removed = inference_state.objects[obj_idx_to_rm]
        obj_input_frames_inds = set()
        obj_input_frames_inds.update(removed.point_inputs_per_frame)
        obj_input_frames_inds.update(removed.mask_inputs_per_frame)
        for frame_idx in obj_input_frames_inds:
            self.clear_all_prompts_in_frame(inference_state, frame_idx, obj_id, need_output=False)
        # the objects after it move down one index, as sam2 remaps them
        del inference_state.objects[obj_idx_to_rm]

        if need_output:
            # the other objects' masks on those frames (one may have been hidden under the removed one)
            for frame_idx in obj_input_frames_inds:
                is_cond = any(frame_idx in obj.pending.cond_frame_outputs for obj in inference_state.objects)
                updated_frames.append((frame_idx, self._frame_masks_at_video_res(inference_state, frame_idx, is_cond)))
        return inference_state.obj_ids, updated_frames

    def _clear_obj_non_cond_mem_around_input(self, inference_state: InferenceState, frame_idx: int, obj_idx: int) -> None:
        """Drop one object's tracked memories within num_maskmem (strided) frames of a prompted
        frame: they may hold the appearance the prompt corrected. (sam2 1.1.0 calls this method
        without defining it; this is sam2's later definition.)"""
        r = self.model.memory_stride
        frame_idx_begin = frame_idx - r * self.model.num_maskmem
        frame_idx_end = frame_idx + r * self.model.num_maskmem
        non_cond_frame_outputs = inference_state.objects[obj_idx].memory.non_cond_frame_outputs
        for t in range(frame_idx_begin, frame_idx_end + 1):
            non_cond_frame_outputs.pop(t, None)

    # --- one frame

    def _frame_backbone_out(self, inference_state: InferenceState, frame_idx: int) -> dict:
        """A frame's backbone_out (one batch entry), from the cache or encoded now: while propagating,
        together with the next frames_per_encode - 1 frames it tracks (kept in the cache until then)."""
        backbone_out = inference_state.cached_features.get(frame_idx)
        if backbone_out is None:
            frames = self._frames_to_encode(inference_state, frame_idx)
            images = inference_state.images[frames].to(inference_state.device).float()
            batch_out = self.model.forward_image(images)
            # every frame's features in one layout, whatever the batch of frames: the compiled tracker guards
            # on strides, so a frame laid out otherwise (the video's last batch, or a frame encoded alone)
            # recompiled its memory attention mid-video (the encoder's outputs once copied its position
            # encodings batch-innermost, a frame of 8 read with strides 8x those of a frame of 1).
            # channels_last: the layout the compiled encoder gives its features, and its position encodings
            # are views of one cached channels_last tensor (in_static_batches): no copy for either
            inference_state.cached_features = {
                t: {key: [level[i : i + 1].contiguous(memory_format=torch.channels_last) for level in batch_out[key]]
                    for key in FRAME_FEATURE_KEYS}
                for i, t in enumerate(frames)
            }
            backbone_out = inference_state.cached_features[frame_idx]
        return backbone_out

    def _frames_to_encode(self, inference_state: InferenceState, frame_idx: int) -> list[int]:
        """frame_idx and, while a propagation tracks it, the frames it tracks next (frames_per_encode in all)."""
        upcoming = inference_state.upcoming
        if self.frames_per_encode == 1 or frame_idx not in upcoming:
            return [frame_idx]
        start = upcoming.index(frame_idx)
        return upcoming[start : start + self.frames_per_encode]

    def _group_image_features(
        self, object_counts: list[tuple[InferenceState, int]], frame_idx: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[tuple[int, int]]]:
        """(vision_feats, vision_pos_embeds, feat_sizes) of a frame for a group of objects, (video,
        its object count): each video's frame expanded to its objects, the videos' concatenated on
        the batch (a copy, where one video's objects share its features)."""
        backbone_outs = [
            _expand_backbone_out(self._frame_backbone_out(state, frame_idx), count)
            for state, count in object_counts
        ]
        if len(backbone_outs) == 1:
            backbone_out = backbone_outs[0]
        else:
            backbone_out = {
                key: [torch.cat(levels, dim=0) for levels in zip(*(out[key] for out in backbone_outs))]
                for key in FRAME_FEATURE_KEYS
            }
        return self.model.frame_features(backbone_out)

    def _run_single_frame_inference(
        self,
        inference_state: InferenceState,
        output_dict: MemoryBank,
        frame_idx: int,
        batch_size: int,
        is_init_cond_frame: bool,
        point_inputs: dict | None,
        mask_inputs: torch.Tensor | None,
        reverse: bool,
        run_mem_encoder: bool,
        prev_sam_mask_logits: torch.Tensor | None = None,
    ) -> tuple[FrameOutput, torch.Tensor]:
        """The tracking step on one frame: (the compact output the bank keeps, the low-res logits
        on the compute device)."""
        current_vision_feats, current_vision_pos_embeds, feat_sizes = self._group_image_features(
            [(inference_state, batch_size)], frame_idx
        )
        if point_inputs is not None and mask_inputs is not None:
            raise ValueError("a frame takes points or a mask, not both")
        current_out = self.model.track_step(
            frame_idx=frame_idx,
            is_init_cond_frame=is_init_cond_frame,
            current_vision_feats=current_vision_feats,
            current_vision_pos_embeds=current_vision_pos_embeds,
            feat_sizes=feat_sizes,
            point_inputs=point_inputs,
            mask_inputs=mask_inputs,
            output_dict=output_dict,
            num_frames=inference_state.num_frames,
            track_in_reverse=reverse,
            run_mem_encoder=run_mem_encoder,
            prev_sam_mask_logits=prev_sam_mask_logits,
        )
        return self._compact_output(inference_state, current_out)

    def _compact_output(self, inference_state: InferenceState, current_out: FrameOutput) -> tuple[FrameOutput, torch.Tensor]:
        """What the bank keeps of a step's output (the logits and bf16 memories on the storage device),
        and the low-res logits on the compute device."""
        storage_device = inference_state.storage_device
        maskmem_features = current_out.maskmem_features
        if maskmem_features is not None:
            # memories are kept in bf16 (half the memory), as sam2 keeps them; the attention reads them so
            maskmem_features = maskmem_features.to(torch.bfloat16).to(storage_device, non_blocking=True)
        pred_masks_gpu = current_out.pred_masks
        if self.fill_hole_area > 0:
            pred_masks_gpu = fill_holes_in_mask_scores(pred_masks_gpu, self.fill_hole_area)
        compact_out = FrameOutput(
            pred_masks=pred_masks_gpu.to(storage_device, non_blocking=True),
            obj_ptr=current_out.obj_ptr,  # small: always on the compute device
            object_score_logits=current_out.object_score_logits,
            maskmem_features=maskmem_features,
            maskmem_pos_enc=self._get_maskmem_pos_enc(inference_state, current_out.maskmem_pos_enc),
        )
        return compact_out, pred_masks_gpu

    def _run_memory_encoder(
        self,
        object_counts: list[tuple[InferenceState, int]],
        frame_idx: int,
        high_res_masks: torch.Tensor,
        object_score_logits: torch.Tensor,
        is_mask_from_pts: bool,
    ) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """The memories of a frame of one or several videos, (video, its object count), from (B, 1, S, S)
        logits, B the counts' sum: per video (bf16 features on its storage device, their encoding)."""
        current_vision_feats, _, feat_sizes = self._group_image_features(object_counts, frame_idx)
        maskmem_features, maskmem_pos_enc = self.model.encode_memory(
            current_vision_feats=current_vision_feats,
            feat_sizes=feat_sizes,
            pred_masks_high_res=high_res_masks,
            object_score_logits=object_score_logits,
            is_mask_from_pts=is_mask_from_pts,
        )
        memories = []
        starts = itertools.accumulate([count for _, count in object_counts], initial=0)
        for (state, count), start in zip(object_counts, starts):
            features = maskmem_features[start : start + count].to(torch.bfloat16)
            pos_enc = [x[start : start + count] for x in maskmem_pos_enc]
            memories.append((features.to(state.storage_device, non_blocking=True), self._get_maskmem_pos_enc(state, pos_enc)))
        return memories

    def _get_maskmem_pos_enc(
        self, inference_state: InferenceState, out_maskmem_pos_enc: list[torch.Tensor] | None
    ) -> list[torch.Tensor] | None:
        """The memories' positional encoding, the same for every frame and object: one copy kept
        in the state, expanded to the batch."""
        if out_maskmem_pos_enc is None:
            return None
        if inference_state.maskmem_pos_enc is None:
            inference_state.maskmem_pos_enc = [x[0:1].clone() for x in out_maskmem_pos_enc]
        batch_size = out_maskmem_pos_enc[0].size(0)
        return [x.expand(batch_size, -1, -1, -1) for x in inference_state.maskmem_pos_enc]


def _by_video(states: list[InferenceState], members: list[tuple[int, object]]) -> list[tuple[InferenceState, list]]:
    """(state, [its items]) per video of `members`, (video, item) pairs in which each video's are together."""
    return [(states[video], [item for _, item in run]) for video, run in itertools.groupby(members, key=lambda m: m[0])]


def _expand_backbone_out(backbone_out: dict, batch_size: int) -> dict:
    """A frame's image features (batch of one) expanded to batch_size objects, without a copy."""
    return {key: [level.expand(batch_size, -1, -1, -1) for level in backbone_out[key]] for key in FRAME_FEATURE_KEYS}


def concat_points(old_point_inputs: dict | None, new_points: torch.Tensor, new_labels: torch.Tensor) -> dict:
    """The frame's point prompt with new points appended."""
    if old_point_inputs is None:
        points, labels = new_points, new_labels
    else:
        points = torch.cat([old_point_inputs["point_coords"], new_points], dim=1)
        labels = torch.cat([old_point_inputs["point_labels"], new_labels], dim=1)
    return {"point_coords": points, "point_labels": labels}
