"""SAM 2's tracking step: a frame's features conditioned on the object's memory, decoded, encoded into a new memory.

sam2.modeling.sam2_base.SAM2Base.track_step and everything it calls (_prepare_memory_conditioned_features,
_forward_sam_heads, _use_mask_as_output, _encode_new_memory, object pointers), as a mixin that
samfast's SAM2Base inherits: the methods keep sam2's names and arguments and run sam2's operations
in sam2's order, so in fp32 they give sam2's bits. With them the mixin implements samfast.video.Tracker,
the protocol samfast.VideoPredictor tracks through (its public methods below name sam2's private ones).

The mixin reads the modules and parameters of SAM 2's layout (image_encoder, memory_attention,
memory_encoder, sam_prompt_encoder, sam_mask_decoder, maskmem_tpos_enc, no_mem_embed, no_obj_ptr,
no_obj_embed_spatial, obj_ptr_proj, obj_ptr_tpos_proj, mask_downsample) and `self.tracking`, the
settings below. Another family's tracker (SAM 3's) implements samfast.video.Tracker on its own
model, sharing the memory bank and the predictor, not this mixin.

Each step reads one object's memory from a MemoryBank (samfast.video.memory_bank): the conditioning
frames (those with prompts), the last num_maskmem - 1 tracked frames, and up to 16 object pointers.
Objects whose steps read the same frames in the same roles (memory_selection_key) take one step as a
batch, of one video or of several, reading their banks through a StackedMemoryBanks. With
fixed_capacity_memory (the compile switch) the memory attention always reads the memory at its
capacity (num_maskmem frames and max_obj_ptrs_in_encoder pointers with one conditioning frame), the
missing slots zero tokens that a key mask takes out of the cross-attention: one shape from the first
tracked frame on, so a compiled memory attention does not recompile as the video grows (sam2's
vos_optimized compiles it dynamic).
What is fixed in every SAM 2 config (object pointers through a 3-layer MLP, an object-score head
whose "absent" replaces the pointer by no_obj_ptr and the mask by NO_OBJ_SCORE, the mask input used
as the output on frames given a mask, high-resolution features in the decoder, no_mem_embed added
directly on a frame without memory) is written in, not an option.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from samfast.sam2.memory.static_graphs import compile_per_object_count
from samfast.modeling.position_encoding import get_1d_sine_pe
from samfast.transfer import to_device
from samfast.video.memory_bank import NO_OBJ_SCORE, FrameOutput, MemoryBank

# a mask input used as the output becomes logits of -10 / +10 (sigmoid 4.5e-5 / 1 - 4.5e-5)
MASK_AS_OUTPUT_SCALE, MASK_AS_OUTPUT_BIAS = 20.0, -10.0


@dataclass(frozen=True)
class TrackingSettings:
    """What sam2's configs and builders set for tracking (sam2.1_hiera_*.yaml, build_sam2_video_predictor).

    SAM 2.1 adds a signed, projected temporal encoding to the object pointers (2.0 gives them none);
    build_sam2_video_predictor's apply_postprocessing binarizes the masks of prompted frames before
    they are encoded into memory (build_sam2, the image builder, does not).
    """

    # at most this many conditioning frames in memory attention, the closest in time (-1: all)
    max_cond_frames_in_attn: int = -1
    # XMem's r: the non-conditioning memories are every r-th frame (plus the last one)
    memory_temporal_stride_for_eval: int = 1
    max_obj_ptrs_in_encoder: int = 16
    # the memory encoder reads sigmoid(logits) * 20 - 10, not the raw probability
    sigmoid_scale_for_mem_enc: float = 20.0
    sigmoid_bias_for_mem_enc: float = -10.0
    binarize_mask_from_pts_for_mem_enc: bool = False
    # keep only the highest-scoring object per pixel before encoding memories (off in every config)
    non_overlap_masks_for_mem_enc: bool = False
    # three masks (the best by predicted IoU kept) for 0 or 1 prompt points, on every frame
    multimask_output_in_sam: bool = True
    multimask_min_pt_num: int = 0
    multimask_max_pt_num: int = 1
    multimask_output_for_tracking: bool = True
    # object pointers: SAM 2.1 True, True, True; SAM 2.0 False, False, False
    add_tpos_enc_to_obj_ptrs: bool = True
    proj_tpos_enc_in_obj_ptrs: bool = True
    use_signed_tpos_enc_to_obj_ptrs: bool = True
    only_obj_ptrs_in_the_past_for_eval: bool = True

    @classmethod
    def for_version(cls, sam2_1: bool, **overrides) -> TrackingSettings:
        return cls(
            add_tpos_enc_to_obj_ptrs=sam2_1,
            proj_tpos_enc_in_obj_ptrs=sam2_1,
            use_signed_tpos_enc_to_obj_ptrs=sam2_1,
            **overrides,
        )


class SAM2Tracking:
    """The tracking step of SAM 2's design; mixed into samfast.sam2.SAM2Base, which it makes a samfast.video.Tracker."""

    tracking: TrackingSettings
    # True: the memory attention reads the memory at its fixed capacity, padded and masked
    # (_at_fixed_capacity), one shape for every step of a video; the compile switch sets it
    fixed_capacity_memory: bool = False
    # set by compile_propagation_heads (the compile switch): _propagation_heads compiled
    compiled_propagation_heads = None

    # --- samfast.video.Tracker: the predictor's and the video task's view, under public names

    @property
    def memory_stride(self) -> int:
        return self.tracking.memory_temporal_stride_for_eval

    @property
    def batches_objects(self) -> bool:
        # non_overlap_masks_for_mem_enc constrains a frame's objects against each other, which sam2
        # (one object at a time) never applies across objects
        return not self.tracking.non_overlap_masks_for_mem_enc

    def frame_features(self, backbone_out: dict) -> tuple[list, list, list]:
        return self._prepare_backbone_features(backbone_out)[1:]

    def encode_memory(self, *args, **kwargs) -> tuple[torch.Tensor, list[torch.Tensor]]:
        # a call, not an alias: what replaces _encode_new_memory on the model (a test counting the
        # encodings) sees the predictor's calls too
        return self._encode_new_memory(*args, **kwargs)

    def non_overlapping_masks(self, pred_masks: torch.Tensor) -> torch.Tensor:
        return self._apply_non_overlapping_constraints(pred_masks)

    def use_input_size(self, size: int) -> None:
        """As sam2's ++model.image_size=size builds it: only the prompt encoder's sizes depend on it
        (positional embeddings and RoPE follow the feature map)."""
        self.image_size = size
        encoder = self.sam_prompt_encoder
        encoder.input_image_size = (size, size)
        encoder.image_embedding_size = (size // 16, size // 16)
        encoder.mask_input_size = (size // 4, size // 4)

    # --- the SAM heads on one frame

    def compile_propagation_heads(self, mode: str) -> None:
        """torch.compile the heads of a frame tracked without prompts, the step every propagated frame takes:
        prompt encoder, decoder, the masks' upscaling and the object pointer as one static graph for one
        object, one for every larger batch (samfast.sam2.memory.static_graphs), in `mode` (with CUDA
        graphs in max-autotune and reduce-overhead). The decoder's own compiled graph is dynamic in the
        prompt counts for clicks and segment everything, and runs without CUDA graphs: a call of one prompt
        is host-bound there (docs/history/figures-from-docstrings.md)."""
        self.compiled_propagation_heads = compile_per_object_count(self._propagation_heads, mode, {0: 0, 1: 0, 2: 0})

    def _propagation_heads(self, backbone_features: torch.Tensor, feat_s0: torch.Tensor, feat_s1: torch.Tensor,
                           multimask_output: bool) -> tuple[torch.Tensor | None, ...]:
        """_sam_heads without prompts, its two multimask outputs None: a tracked frame keeps only the best
        mask (track_step), so the compiled graph upscales that one alone and copies no (B, 3, 1024, 1024)
        fp32 masks out of the CUDA graphs' pool (8 objects: 100 MB written twice a frame)."""
        _, _, *kept = self._sam_heads(backbone_features, None, None, [feat_s0, feat_s1], multimask_output)
        return (None, None, *kept)

    def _forward_sam_heads(
        self,
        backbone_features: torch.Tensor,
        point_inputs: dict | None = None,
        mask_inputs: torch.Tensor | None = None,
        high_res_features: list[torch.Tensor] | None = None,
        multimask_output: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """Prompt encoder and mask decoder on (B, C, 64, 64) features, as sam2 returns them:
        (low-res multimasks, high-res multimasks, IoUs, low-res mask, high-res mask, object
        pointer (B, C), object score logits (B, 1)); the single masks are the best by IoU.
        A frame without prompts takes the compiled propagation heads where the compile switch built them
        (the multimasks None there: _propagation_heads)."""
        if point_inputs is None and mask_inputs is None and self.compiled_propagation_heads is not None:
            return self.compiled_propagation_heads(backbone_features, *high_res_features, multimask_output)
        return self._sam_heads(backbone_features, point_inputs, mask_inputs, high_res_features, multimask_output)

    def _sam_heads(
        self,
        backbone_features: torch.Tensor,
        point_inputs: dict | None,
        mask_inputs: torch.Tensor | None,
        high_res_features: list[torch.Tensor],
        multimask_output: bool,
    ) -> tuple[torch.Tensor, ...]:
        """_forward_sam_heads, uncompiled."""
        B = backbone_features.size(0)
        device = backbone_features.device
        if point_inputs is not None:
            sam_point_coords = point_inputs["point_coords"]
            sam_point_labels = point_inputs["point_labels"]
        else:
            # no points: one padding point (label -1), so the decoder always sees a sparse prompt
            sam_point_coords = torch.zeros(B, 1, 2, device=device)
            sam_point_labels = -torch.ones(B, 1, dtype=torch.int32, device=device)

        sam_mask_prompt = None  # None: the prompt encoder adds its learned no_mask_embed
        if mask_inputs is not None:
            if mask_inputs.shape[-2:] != self.sam_prompt_encoder.mask_input_size:
                sam_mask_prompt = F.interpolate(
                    mask_inputs.float(),
                    size=self.sam_prompt_encoder.mask_input_size,
                    align_corners=False,
                    mode="bilinear",
                    antialias=True,  # downsampling
                )
            else:
                sam_mask_prompt = mask_inputs

        sparse_embeddings, dense_embeddings = self.sam_prompt_encoder(
            points=(sam_point_coords, sam_point_labels), boxes=None, masks=sam_mask_prompt
        )
        low_res_multimasks, ious, sam_output_tokens, object_score_logits = self.sam_mask_decoder(
            image_embeddings=backbone_features,
            image_pe=self.sam_prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse_embeddings,
            dense_prompt_embeddings=dense_embeddings,
            multimask_output=multimask_output,
            repeat_image=False,  # the features are already one per object
            high_res_features=high_res_features,
        )
        # the mask of an absent object is a hard NO_OBJ_SCORE, consistent with its memory
        is_obj_appearing = object_score_logits > 0
        low_res_multimasks = torch.where(is_obj_appearing[:, None, None], low_res_multimasks, NO_OBJ_SCORE)
        low_res_multimasks = low_res_multimasks.float()
        high_res_multimasks = F.interpolate(
            low_res_multimasks, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False
        )

        sam_output_token = sam_output_tokens[:, 0]
        if multimask_output:
            best_iou_inds = torch.argmax(ious, dim=-1)
            batch_inds = torch.arange(B, device=device)
            low_res_masks = low_res_multimasks[batch_inds, best_iou_inds].unsqueeze(1)
            high_res_masks = high_res_multimasks[batch_inds, best_iou_inds].unsqueeze(1)
            if sam_output_tokens.size(1) > 1:  # the multimask tokens are the pointers' tokens
                sam_output_token = sam_output_tokens[batch_inds, best_iou_inds]
        else:
            low_res_masks, high_res_masks = low_res_multimasks, high_res_multimasks

        obj_ptr = self._gate_obj_ptr(self.obj_ptr_proj(sam_output_token), is_obj_appearing.to(sam_output_token.dtype))
        return low_res_multimasks, high_res_multimasks, ious, low_res_masks, high_res_masks, obj_ptr, object_score_logits

    def _gate_obj_ptr(self, obj_ptr: torch.Tensor, lambda_is_obj_appearing: torch.Tensor) -> torch.Tensor:
        """An absent object's pointer is no_obj_ptr (sam2's fixed_no_obj_ptr; a hard choice,
        soft_no_obj_ptr is off in every config)."""
        obj_ptr = lambda_is_obj_appearing * obj_ptr
        return obj_ptr + (1 - lambda_is_obj_appearing) * self.no_obj_ptr

    def _use_mask_as_output(
        self, backbone_features: torch.Tensor, high_res_features: list[torch.Tensor], mask_inputs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """A mask prompt taken as the output (a ground truth) without the decoder's mask; the
        decoder runs on the downsampled mask only for the object pointer. Same outputs as
        _forward_sam_heads."""
        mask_inputs_float = mask_inputs.float()
        high_res_masks = mask_inputs_float * MASK_AS_OUTPUT_SCALE + MASK_AS_OUTPUT_BIAS
        low_res_masks = F.interpolate(
            high_res_masks,
            size=(high_res_masks.size(-2) // 4, high_res_masks.size(-1) // 4),
            align_corners=False,
            mode="bilinear",
            antialias=True,
        )
        ious = mask_inputs.new_ones(mask_inputs.size(0), 1).float()  # a dummy IoU of 1
        _, _, _, _, _, obj_ptr, _ = self._forward_sam_heads(
            backbone_features=backbone_features,
            mask_inputs=self.mask_downsample(mask_inputs_float),
            high_res_features=high_res_features,
        )
        # the mask, not the decoder's object score, says whether the object is there
        is_obj_appearing = torch.any(mask_inputs.flatten(1).float() > 0.0, dim=1)[..., None]
        lambda_is_obj_appearing = is_obj_appearing.float()
        object_score_logits = MASK_AS_OUTPUT_SCALE * lambda_is_obj_appearing + MASK_AS_OUTPUT_BIAS
        obj_ptr = self._gate_obj_ptr(obj_ptr, lambda_is_obj_appearing.to(obj_ptr.dtype))
        return low_res_masks, high_res_masks, ious, low_res_masks, high_res_masks, obj_ptr, object_score_logits

    def _use_multimask(self, is_init_cond_frame: bool, point_inputs: dict | None) -> bool:
        """Three masks for 0 or 1 points (a box counts as two), on every frame."""
        s = self.tracking
        num_pts = 0 if point_inputs is None else point_inputs["point_labels"].size(1)
        return (
            s.multimask_output_in_sam
            and (is_init_cond_frame or s.multimask_output_for_tracking)
            and (s.multimask_min_pt_num <= num_pts <= s.multimask_max_pt_num)
        )

    # --- memory: reading it (memory attention) and writing it (memory encoder)

    def _prepare_memory_conditioned_features(
        self,
        frame_idx: int,
        is_init_cond_frame: bool,
        current_vision_feats: list[torch.Tensor],
        current_vision_pos_embeds: list[torch.Tensor],
        feat_sizes: list[tuple[int, int]],
        output_dict: MemoryBank,
        num_frames: int,
        track_in_reverse: bool = False,
    ) -> torch.Tensor:
        """The frame's lowest-resolution features (B, C, H, W) after attending to the object's
        memory (output_dict: a MemoryBank); on a frame without memory, plus no_mem_embed."""
        B = current_vision_feats[-1].size(1)
        C = self.hidden_dim
        H, W = feat_sizes[-1]
        if is_init_cond_frame:
            # a first prompted frame is segmented like an image: no memory to attend to
            pix_feat_with_mem = current_vision_feats[-1] + self.no_mem_embed
            return pix_feat_with_mem.permute(1, 2, 0).view(B, C, H, W)

        device = current_vision_feats[-1].device
        selected_cond, memories, pointers = self._memory_reads(output_dict, frame_idx, num_frames, track_in_reverse)
        memory, memory_pos = self._spatial_memories(selected_cond, memories, device)
        obj_ptrs, obj_pos = self._object_pointers(frame_idx, selected_cond, pointers, num_frames, track_in_reverse, device)
        if self.fixed_capacity_memory:
            memory, memory_pos, num_obj_ptr_tokens, memory_mask = self._at_fixed_capacity(
                memory, memory_pos, obj_ptrs, obj_pos, num_cond=len(selected_cond)
            )
        else:
            num_obj_ptr_tokens, memory_mask = 0, None
            if obj_ptrs is not None:
                memory.append(obj_ptrs)
                memory_pos.append(obj_pos)
                num_obj_ptr_tokens = obj_ptrs.shape[1]
            memory, memory_pos = (torch.cat(parts, dim=1).transpose(0, 1) for parts in (memory, memory_pos))

        pix_feat_with_mem = self.memory_attention(
            curr=current_vision_feats,
            curr_pos=current_vision_pos_embeds,
            memory=memory,
            memory_pos=memory_pos,
            num_obj_ptr_tokens=num_obj_ptr_tokens,
            memory_mask=memory_mask,
        )
        return pix_feat_with_mem.permute(1, 2, 0).view(B, C, H, W)

    def _at_fixed_capacity(
        self,
        memory: list[torch.Tensor],
        memory_pos: list[torch.Tensor],
        obj_ptrs: torch.Tensor | None,
        obj_pos: torch.Tensor | None,
        num_cond: int,
    ) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """The memory at the fixed capacity of a step with num_cond conditioning frames: num_cond +
        num_maskmem - 1 frame slots, then num_cond + max_obj_ptrs_in_encoder - 1 pointer slots, each
        part's real tokens first (in sam2's order, with sam2's encodings), zero tokens after them:
        (memory (M, B, C), its encodings (M, 1, C), the pointer tokens' count, key mask (B, M): False
        for padding). The memory is a view of one (B, M, C) tensor, each part copied in once as rows
        of whole tokens. The rotations reach the same frame tokens, since every frame slot is rotated alike."""
        B, frame_tokens = memory[0].shape[:2]
        ptr_tokens = max(self.hidden_dim // self.mem_dim, 1)  # tokens a pointer is split into
        frames = (num_cond + self.num_maskmem - 1) * frame_tokens
        ptrs = (num_cond + self.tracking.max_obj_ptrs_in_encoder - 1) * ptr_tokens
        real_frames = len(memory) * frame_tokens
        real_ptrs = 0 if obj_ptrs is None else obj_ptrs.shape[1]

        def padded(frame_parts: list[torch.Tensor], ptr_part: torch.Tensor | None) -> torch.Tensor:
            like = frame_parts[0]
            ptr_parts = [] if ptr_part is None else [ptr_part]
            parts = [*frame_parts, _zeros(like, frames - real_frames), *ptr_parts, _zeros(like, ptrs - real_ptrs)]
            return torch.cat(parts, dim=1).transpose(0, 1)

        tokens, pos = padded(memory, obj_ptrs), padded(memory_pos, obj_pos)
        index = torch.arange(frames + ptrs, device=tokens.device)
        real = (index < real_frames) | ((index >= frames) & (index < frames + real_ptrs))
        return tokens, pos, ptrs, real.expand(B, -1)

    def _memory_reads(
        self, output_dict: MemoryBank, frame_idx: int, num_frames: int, track_in_reverse: bool
    ) -> tuple[dict[int, FrameOutput], list[tuple[int, FrameOutput]], list[tuple[int, FrameOutput]]]:
        """What the step on frame_idx reads from the bank: the selected conditioning frames
        {frame: output}, the recent memories [(temporal position, output)] and the recent
        pointers [(distance, output)]."""
        s = self.tracking
        selected_cond, unselected_cond = output_dict.select_cond_frames(frame_idx, s.max_cond_frames_in_attn)
        stride = 1 if self.training else s.memory_temporal_stride_for_eval
        memories = output_dict.recent_memories(frame_idx, self.num_maskmem, stride, track_in_reverse, unselected_cond)
        pointers = output_dict.recent_pointers(
            frame_idx, min(num_frames, s.max_obj_ptrs_in_encoder), num_frames, track_in_reverse, unselected_cond
        )
        return selected_cond, memories, pointers

    def memory_selection_key(
        self, output_dict: MemoryBank, frame_idx: int, num_frames: int, track_in_reverse: bool
    ) -> tuple:
        """Which of the bank's frames a step on frame_idx (one that is not an initial conditioning
        frame) reads, and in which roles: the selected conditioning frames, the recent memories'
        temporal positions and the recent pointers' distances (a position or a distance names its
        frame); with the frame and the pointers' reach (the video's length up to
        max_obj_ptrs_in_encoder, which normalizes their temporal encoding). Objects whose keys are
        equal, of one video or of several, can take the step as one batch, their memories stacked
        (samfast.video.memory_bank.StackedMemoryBanks), given any of their videos' num_frames: past
        the reach the length only ends the pointers' search, where equal keys found the same."""
        selected_cond, memories, pointers = self._memory_reads(output_dict, frame_idx, num_frames, track_in_reverse)
        return (
            frame_idx,
            min(num_frames, self.tracking.max_obj_ptrs_in_encoder),
            tuple(selected_cond),
            tuple(t_pos for t_pos, _ in memories),
            tuple(t_diff for t_diff, _ in pointers),
        )

    def _spatial_memories(
        self,
        selected_cond: dict[int, FrameOutput],
        memories: list[tuple[int, FrameOutput]],
        device: torch.device,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The memory tokens (B, HW, 64) of the conditioning frames (temporal position 0) and of the
        recent tracked frames (1 the oldest .. num_maskmem - 1 the previous frame), and their spatial
        plus temporal encodings (1, HW, 64). The spatial encoding is the sine encoding of the memory
        map's size (MemoryEncoder.position_encoding), the same for every object: one row of it is read
        and summed, the attention broadcasts it over the objects (no copy of the encodings per object:
        docs/history/sam2-video-speed.md, 1269e8c)."""
        t_pos_and_prevs = [(0, out) for out in selected_cond.values()] + memories
        memory, memory_pos = [], []
        dtype = self.maskmem_tpos_enc.dtype
        for t_pos, prev in t_pos_and_prevs:
            # Memories may be stored elsewhere (offload_state_to_cpu) and are stored in bf16. sam2
            # leaves them in bf16 and relies on the concatenation with the object pointers to
            # promote them; on a frame with no pointer yet (an object tracked before its first
            # prompted frame) fp32 sam2 then fails in the attention (mat1 and mat2 must have the
            # same dtype). Converting here gives the same values (bf16 -> fp32 is exact) and runs.
            feats = prev.maskmem_features.to(device, non_blocking=True).to(dtype)
            memory.append(feats.flatten(2).transpose(1, 2))  # a view where the memory is channels-last
            maskmem_enc = prev.maskmem_pos_enc[-1][:1].to(device)
            maskmem_enc = maskmem_enc.flatten(2).transpose(1, 2)
            maskmem_enc = maskmem_enc + self.maskmem_tpos_enc[self.num_maskmem - t_pos - 1]
            memory_pos.append(maskmem_enc)
        return memory, memory_pos

    def _object_pointers(
        self,
        frame_idx: int,
        selected_cond: dict[int, FrameOutput],
        pointers: list[tuple[int, FrameOutput]],
        num_frames: int,
        track_in_reverse: bool,
        device: torch.device,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The object pointers of the conditioning frames (in the past only, in eval) and of up to
        15 recent frames, as (B, 4 * P, 64) tokens (each 256-wide pointer split in four) and their
        temporal encodings (1, 4 * P, 64), the same for every object; (None, None) when there is none."""
        s = self.tracking
        C = self.hidden_dim
        max_obj_ptrs_in_encoder = min(num_frames, s.max_obj_ptrs_in_encoder)
        if not self.training and s.only_obj_ptrs_in_the_past_for_eval:
            ptr_cond_outputs = {
                t: out for t, out in selected_cond.items() if (t >= frame_idx if track_in_reverse else t <= frame_idx)
            }
        else:
            ptr_cond_outputs = selected_cond
        # how far each pointer is from this frame (signed in SAM 2.1: negative when tracking backwards)
        tpos_sign_mul = -1 if track_in_reverse else 1
        pos_and_ptrs = [
            ((frame_idx - t) * tpos_sign_mul if s.use_signed_tpos_enc_to_obj_ptrs else abs(frame_idx - t), out.obj_ptr)
            for t, out in ptr_cond_outputs.items()
        ]
        pos_and_ptrs += [(t_diff, out.obj_ptr) for t_diff, out in pointers]
        if not pos_and_ptrs:
            return None, None

        pos_list, ptrs_list = zip(*pos_and_ptrs)
        obj_ptrs = torch.stack(ptrs_list, dim=1)  # (B, P, C)
        if s.add_tpos_enc_to_obj_ptrs:
            # a sine encoding of the distance, normalized by the largest distance
            t_diff_max = max_obj_ptrs_in_encoder - 1
            tpos_dim = C if s.proj_tpos_enc_in_obj_ptrs else self.mem_dim
            obj_pos = to_device(pos_list, torch.int64, device)
            obj_pos = get_1d_sine_pe(obj_pos / t_diff_max, dim=tpos_dim)
            # the sine in fp32 (positions / t_diff_max), the projection in the model's dtype
            obj_pos = self.obj_ptr_tpos_proj(obj_pos.to(self.dtype))
        else:
            obj_pos = obj_ptrs.new_zeros(len(pos_list), self.mem_dim)
        if self.mem_dim < C:
            # a pointer is C // mem_dim memory tokens, in a row
            obj_ptrs = obj_ptrs.reshape(obj_ptrs.shape[0], -1, self.mem_dim)
            obj_pos = obj_pos.repeat_interleave(C // self.mem_dim, dim=0)
        return obj_ptrs, obj_pos.unsqueeze(0)

    def _encode_new_memory(
        self,
        current_vision_feats: list[torch.Tensor],
        feat_sizes: list[tuple[int, int]],
        pred_masks_high_res: torch.Tensor,
        object_score_logits: torch.Tensor,
        is_mask_from_pts: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The frame's memory: its lowest-resolution features fused with its (B, 1, 1024, 1024)
        mask logits by the memory encoder, (B, 64, 64, 64) and its positional encoding."""
        B = current_vision_feats[-1].size(1)
        C = self.hidden_dim
        H, W = feat_sizes[-1]
        pix_feat = current_vision_feats[-1].permute(1, 2, 0).view(B, C, H, W)
        s = self.tracking
        if s.non_overlap_masks_for_mem_enc and not self.training:
            pred_masks_high_res = self._apply_non_overlapping_constraints(pred_masks_high_res)
        if s.binarize_mask_from_pts_for_mem_enc and is_mask_from_pts and not self.training:
            # a prompted frame's memory holds exactly the mask the user saw
            mask_for_mem = (pred_masks_high_res > 0).float()
        else:
            mask_for_mem = torch.sigmoid(pred_masks_high_res)
        if s.sigmoid_scale_for_mem_enc != 1.0:
            mask_for_mem = mask_for_mem * s.sigmoid_scale_for_mem_enc
        if s.sigmoid_bias_for_mem_enc != 0.0:
            mask_for_mem = mask_for_mem + s.sigmoid_bias_for_mem_enc
        # in the model's dtype (bf16 stage: the encoder's convs are bf16); a no-op in fp32
        maskmem_out = self.memory_encoder(pix_feat, mask_for_mem.to(pix_feat.dtype), skip_mask_sigmoid=True)
        maskmem_features = maskmem_out["vision_features"]
        maskmem_pos_enc = maskmem_out["vision_pos_enc"]
        if self.no_obj_embed_spatial is not None:
            # SAM 2.1: a frame where the object is absent (occluded) says so in its memory
            is_obj_appearing = (object_score_logits > 0).float()
            maskmem_features += (1 - is_obj_appearing[..., None, None]) * self.no_obj_embed_spatial[
                ..., None, None
            ].expand(*maskmem_features.shape)
        return maskmem_features, maskmem_pos_enc

    def _apply_non_overlapping_constraints(self, pred_masks: torch.Tensor) -> torch.Tensor:
        """Per pixel, every object but the highest-scoring one clamped to at most -10 (objects on dim 0)."""
        batch_size = pred_masks.size(0)
        if batch_size == 1:
            return pred_masks
        max_obj_inds = torch.argmax(pred_masks, dim=0, keepdim=True)
        batch_obj_inds = torch.arange(batch_size, device=pred_masks.device)[:, None, None, None]
        keep = max_obj_inds == batch_obj_inds
        return torch.where(keep, pred_masks, torch.clamp(pred_masks, max=-10.0))

    # --- the step

    def track_step(
        self,
        frame_idx: int,
        is_init_cond_frame: bool,
        current_vision_feats: list[torch.Tensor],
        current_vision_pos_embeds: list[torch.Tensor],
        feat_sizes: list[tuple[int, int]],
        point_inputs: dict | None,
        mask_inputs: torch.Tensor | None,
        output_dict: MemoryBank,
        num_frames: int,
        track_in_reverse: bool = False,
        run_mem_encoder: bool = True,
        prev_sam_mask_logits: torch.Tensor | None = None,
    ) -> FrameOutput:
        """One object (or a batch of them) on one frame: the masks, the object pointer and,
        with run_mem_encoder, the frame's new memory.

        current_vision_feats / _pos_embeds: the frame's three levels as (HW, B, C) (from
        _prepare_backbone_features); point_inputs {"point_coords" (B, P, 2) in the 1024 frame,
        "point_labels" (B, P)}; mask_inputs (B, 1, 1024, 1024); output_dict: the object's
        MemoryBank; prev_sam_mask_logits: the frame's earlier low-res logits, given to the
        decoder with correction clicks.
        """
        # the stride-4 and stride-8 levels, (HW)BC -> BCHW, for the decoder's upscaling
        high_res_features = [
            x.permute(1, 2, 0).view(x.size(1), x.size(2), *s)
            for x, s in zip(current_vision_feats[:-1], feat_sizes[:-1])
        ]
        mask_prompt = mask_inputs
        if mask_inputs is not None:
            pix_feat = current_vision_feats[-1].permute(1, 2, 0)
            pix_feat = pix_feat.view(-1, self.hidden_dim, *feat_sizes[-1])
            sam_outputs = self._use_mask_as_output(pix_feat, high_res_features, mask_inputs)
        else:
            pix_feat = self._prepare_memory_conditioned_features(
                frame_idx=frame_idx,
                is_init_cond_frame=is_init_cond_frame,
                current_vision_feats=current_vision_feats[-1:],
                current_vision_pos_embeds=current_vision_pos_embeds[-1:],
                feat_sizes=feat_sizes[-1:],
                output_dict=output_dict,
                num_frames=num_frames,
                track_in_reverse=track_in_reverse,
            )
            if prev_sam_mask_logits is not None:
                mask_inputs = prev_sam_mask_logits
            sam_outputs = self._forward_sam_heads(
                backbone_features=pix_feat,
                point_inputs=point_inputs,
                mask_inputs=mask_inputs,
                high_res_features=high_res_features,
                multimask_output=self._use_multimask(is_init_cond_frame, point_inputs),
            )
        _, _, _, low_res_masks, high_res_masks, obj_ptr, object_score_logits = sam_outputs
        current_out = FrameOutput(
            pred_masks=low_res_masks,
            obj_ptr=obj_ptr,
            object_score_logits=object_score_logits,
            pred_masks_high_res=high_res_masks,
            point_inputs=point_inputs,
            mask_inputs=mask_prompt,
        )
        if run_mem_encoder:
            current_out.maskmem_features, current_out.maskmem_pos_enc = self._encode_new_memory(
                current_vision_feats=current_vision_feats,
                feat_sizes=feat_sizes,
                pred_masks_high_res=high_res_masks,
                object_score_logits=object_score_logits,
                is_mask_from_pts=point_inputs is not None,
            )
        return current_out


def _zeros(like: torch.Tensor, count: int) -> torch.Tensor:
    """count padding tokens of a memory part like `like` (B, tokens, C), or of its encodings: zeros."""
    if count < 0:
        raise ValueError(f"the memory holds {-count} token(s) more than its fixed capacity")
    return like.new_zeros(like.shape[0], count, like.shape[2])
