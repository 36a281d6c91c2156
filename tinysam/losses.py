"""SAM's training loss: focal + dice on the best of the multimask outputs, MSE on the IoU head;
SAM 2's adds BCE on its object-score head. Optionally (--embedding-mean-penalty) a term on the image
embedding's spatial mean."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FOCAL_WEIGHT, DICE_WEIGHT, IOU_WEIGHT = 20.0, 1.0, 1.0
OBJECT_WEIGHT = 1.0  # SAM 2.1's training configs: loss_class 1


def mask_loss_table(logits: torch.Tensor, targets: torch.Tensor, gamma: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output sigmoid focal loss (mean over pixels) and dice loss: two (P, C) tables.

    logits (P, C, h, w); targets (P, h, w) in [0, 1] (soft at edges). No alpha weighting: with
    soft targets it would move the 0.5 crossing, i.e. shrink every mask.
    """
    logits = logits.float()
    t = targets[:, None].float().expand_as(logits)
    prob = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, t, reduction="none")
    p_t = prob * t + (1 - prob) * (1 - t)
    focal = (ce * (1 - p_t) ** gamma).mean(dim=(2, 3))
    inter = (prob * t).sum(dim=(2, 3))
    dice = 1 - (2 * inter + 1) / (prob.sum(dim=(2, 3)) + t.sum(dim=(2, 3)) + 1)
    return focal, dice


@torch.no_grad()
def output_ious(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(P, C) IoU of each output mask (logits > 0) with the target (covered >= half), at low res."""
    pred = logits > 0
    truth = (targets >= 0.5)[:, None]
    inter = (pred & truth).sum(dim=(2, 3)).float()
    union = (pred | truth).sum(dim=(2, 3)).float()
    return torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(union))


def sam_loss(logits: torch.Tensor, iou_pred: torch.Tensor, targets: torch.Tensor,
             single_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAM's training loss for (P, 4, h, w) logits and (P, 4) IoU predictions (output 0 = single mask).

    The mask loss (20 focal + 1 dice) of the three multimask outputs counts only for the output
    that matches best (the min over outputs), so each can specialise on one reading of an
    ambiguous prompt; the IoU head learns every output's real IoU (MSE).
    """
    focal, dice = mask_loss_table(logits, targets)
    table = FOCAL_WEIGHT * focal + DICE_WEIGHT * dice  # (P, 4)
    best = table[:, 1:].argmin(dim=1)
    mask_term = table[:, 1:].gather(1, best[:, None]).mean()
    single_term = table[:, 0].mean()
    iou_term = F.mse_loss(iou_pred.float(), output_ious(logits, targets))
    total = mask_term + single_weight * single_term + IOU_WEIGHT * iou_term
    return total, {"mask": mask_term.detach(), "single": single_term.detach(), "iou": iou_term.detach(),
                   "best": best.detach()}


def sam2_loss(logits: torch.Tensor, iou_pred: torch.Tensor, object_logits: torch.Tensor, targets: torch.Tensor,
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAM 2's training loss: sam_loss, plus BCE of the object-score logits (P, 1) against "the
    object is in the image" (sam2's loss_class: focal with gamma 0 and no alpha, i.e. plain BCE).

    Every prompt here is on an object, so that target is always 1, and sam2's masking of the mask
    and IoU terms where no object is present never applies. (sam2 takes the IoU term as L1; the
    MSE is kept here so both families report the same figure.)
    """
    total, parts = sam_loss(logits, iou_pred, targets)
    object_logits = object_logits.float()
    object_term = F.binary_cross_entropy_with_logits(object_logits, torch.ones_like(object_logits))
    return total + OBJECT_WEIGHT * object_term, {**parts, "object": object_term.detach()}


def embedding_mean_penalty(embeddings: torch.Tensor) -> torch.Tensor:
    """The mean over images and channels of the squared spatial mean of (B, C, H, W) image embeddings.

    Why (the small SAM 2, docs/tiny-model.md): Hiera's residual stream ends in no norm, and the nano's
    embedding grew a per-channel constant while it trained (its spatial mean, RMS over channels, 2.2 at the
    seeded init, 6.5 at step 300, where vit_tiny's stays 0.84); a constant in the image tokens makes the
    decoder's attention the same at every position. Without this term the nano's runs stalled at held-out
    mIoU 0.12, with it (weight 0.1, the family's default) the packaged run reached 0.81. A training-only
    term: the architecture and the checkpoint layout stay sam2's.
    """
    return embeddings.float().mean(dim=(2, 3)).pow(2).mean()
