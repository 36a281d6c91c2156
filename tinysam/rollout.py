"""The tracking run's forward and loss: a batch of windows tracked as the video predictor tracks
them, with gradients, through the modules only tracking uses.

What trains (VIDEO_MODULES): the memory attention, the memory encoder, the object pointers'
projections and encodings and the "absent" embeddings, the parts of SAM 2 that a single image
never runs, and the decoder's object-score head, which only the tracker reads (an image
predictor's masks and scores never depend on it; the image run trained it on present objects
alone, so it called every object present). The rest of the image path (trunk, neck, prompt
encoder, decoder, no_mem_embed) stays as the image run left it, in eval mode: every image result
of the checkpoint stays bit for bit, and a tracked frame's decoder runs as the predictor runs it.
So memory must write into the frame's features what the frozen decoder, given no prompt, segments
as the object, and the object-score head must learn to read there that the object has gone.

The step is sam2's own (samfast.sam2.tracker SAM2Tracking.track_step, sam2's SAM2Train rollout):
frame 0 of each window decodes its click on the image features (no memory), every later frame
reads the memories of the frames before it, and each frame's mask is encoded into a new memory,
gradients flowing through all of them. The tracker's own `training` flag is on, as sam2 trains:
the prompted frame's memory takes the sigmoid of its mask rather than the binarized mask, and the
objects of a batch (from different windows) are not made to exclude each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samfast.video.memory_bank import MemoryBank
from tinysam.clips import WindowBatch
from tinysam.losses import DICE_WEIGHT, FOCAL_WEIGHT, OBJECT_WEIGHT, mask_loss_table

VIDEO_MODULES = ("memory_attention", "memory_encoder", "obj_ptr_proj", "obj_ptr_tpos_proj", "maskmem_tpos_enc",
                 "no_obj_ptr", "no_obj_embed_spatial", "mask_downsample", "sam_mask_decoder.pred_obj_score_head")
FROZEN_MODULES = ("image_encoder", "sam_prompt_encoder", "sam_mask_decoder")  # the image path, in eval mode
# (the object-score head trains in eval mode too: an MLP, which train and eval run alike)


def video_module_of(name: str) -> str | None:
    """The entry of VIDEO_MODULES that the parameter (or state-dict key) `name` belongs to; None on the image path."""
    return next((module for module in VIDEO_MODULES if name == module or name.startswith(module + ".")), None)


def prepare_for_tracking(model) -> list[torch.nn.Parameter]:
    """Freeze the image path, train the video modules (attention through SDPA); their parameters."""
    model.train().requires_grad_(False)
    for name in FROZEN_MODULES:
        getattr(model, name).eval()
    trainable = []
    for name, param in model.named_parameters():
        if video_module_of(name):
            param.requires_grad_(True)
            trainable.append(param)
    for module in model.modules():
        if hasattr(module, "attn_impl"):
            module.attn_impl = "sdpa"  # fused attention kernels train several times faster than the math path
    return trainable


def set_tracking_mode(model, training: bool) -> None:
    """Training: the tracker and video modules in train mode, the image path in eval; else all in eval."""
    model.train(training)
    for name in FROZEN_MODULES:
        getattr(model, name).eval()


def track_windows(model, batch: WindowBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every object of the batch through its window: per frame, (low-res mask logits (N, 1, h, w),
    object score logits (N, 1)); frame 0 is the prompted frame."""
    num_windows, num_frames = batch.frames.shape[:2]
    bank = MemoryBank()
    points = {"point_coords": batch.points,
              "point_labels": torch.ones(batch.points.shape[:2], dtype=torch.int32, device=batch.points.device)}
    outputs = []
    for t in range(num_frames):
        with torch.no_grad():  # the frozen image path: features only
            backbone_out = model.forward_image(batch.frames[:, t])
            feats, pos, sizes = model.frame_features(backbone_out)
        # each object reads its own window's frame
        feats = [level[:, batch.window] for level in feats]
        pos = [level[:, batch.window] for level in pos]
        out = model.track_step(
            frame_idx=t, is_init_cond_frame=t == 0, current_vision_feats=feats, current_vision_pos_embeds=pos,
            feat_sizes=sizes, point_inputs=points if t == 0 else None, mask_inputs=None, output_dict=bank,
            num_frames=num_frames, run_mem_encoder=t < num_frames - 1,  # the last frame's memory is never read
        )
        bank.storage(t == 0)[t] = out
        outputs.append((out.pred_masks, out.object_score_logits))
    return outputs


def tracking_loss(outputs: list[tuple[torch.Tensor, torch.Tensor]], batch: WindowBatch
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Over the tracked frames (1 on): 20 focal + dice on the mask where the object is in the frame
    and the tracker says so (an object it calls absent has constant NO_OBJ_SCORE logits: no gradient,
    its error is the object term's). Over every frame: BCE of the object score against "the object
    is in the frame" (sam2's loss_class); on frame 0, the clicked one, the object always is, which
    keeps the trained object-score head from calling a clicked object absent. Frame 0's mask is the
    frozen image path's: no mask term there."""
    mask_terms, object_terms, counted = [], [], []
    for t, (logits, object_logits) in enumerate(outputs):
        present = batch.present[:, t]
        object_terms.append(F.binary_cross_entropy_with_logits(object_logits[:, 0].float(), present.float()))
        if t == 0:
            continue
        scored = present & (object_logits[:, 0] > 0)
        focal, dice = mask_loss_table(logits, batch.targets[:, t])
        mask_terms.append(((FOCAL_WEIGHT * focal + DICE_WEIGHT * dice)[:, 0] * scored).sum())
        counted.append(scored.sum())
    mask_term = torch.stack(mask_terms).sum() / torch.stack(counted).sum().clamp(min=1)
    object_term = torch.stack(object_terms).mean()
    return mask_term + OBJECT_WEIGHT * object_term, {"mask": mask_term.detach(), "object": object_term.detach()}
