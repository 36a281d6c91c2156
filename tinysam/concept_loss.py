"""The concept trainer's loss: DETR's, the kind SAM 3's detector trains with, per (image, phrase) prompt.

Each prompt's queries are matched one to one to the phrase's instances in the image (Hungarian, on
DETR's cost: class probability, box L1 and generalized IoU). Matched queries learn the instance: a
score of 1, its box (L1 + GIoU) and its mask (SAM's focal x20 + dice, tinysam.losses); every other query
learns a score of 0 (sigmoid focal loss, normalized by the instances). The presence head learns whether
the phrase has an instance in the image at all, which sam3 multiplies into every query's score.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torchvision.ops import box_convert, generalized_box_iou_loss, sigmoid_focal_loss

from tinysam.losses import DICE_WEIGHT, FOCAL_WEIGHT, mask_loss_table

# Deformable DETR's matching costs and loss weights
COST_CLASS, COST_BOX, COST_GIOU = 2.0, 5.0, 2.0
CLASS_WEIGHT, BOX_WEIGHT, GIOU_WEIGHT, MASK_WEIGHT, PRESENCE_WEIGHT = 2.0, 5.0, 2.0, 1.0, 1.0
LOSS_PARTS = ("class", "box", "giou", "mask", "presence")
# sigmoid focal loss without its alpha (-1): weighting positives by 0.25 left the matched queries near
# 0.3 on scenes a run had fit (boxes and presence learnt), never crossing the 0.5 threshold
CLASS_ALPHA = -1.0


def xyxy(boxes: torch.Tensor) -> torch.Tensor:
    return box_convert(boxes, "cxcywh", "xyxy")


def pairwise_giou(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Generalized IoU of every box of a (P, Q, 4) with every box of b (P, K, 4), per prompt: (P, Q, K).
    xyxy; eps keeps an empty padding box finite."""
    a, b = a[:, :, None], b[:, None]
    low, high = torch.maximum(a[..., :2], b[..., :2]), torch.minimum(a[..., 2:], b[..., 2:])
    inter = (high - low).clamp(min=0).prod(-1)
    union = (a[..., 2:] - a[..., :2]).prod(-1) + (b[..., 2:] - b[..., :2]).prod(-1) - inter
    hull = (torch.maximum(a[..., 2:], b[..., 2:]) - torch.minimum(a[..., :2], b[..., :2])).prod(-1)
    return inter / (union + eps) - (hull - union) / (hull + eps)


@torch.no_grad()
def match(logits: torch.Tensor, boxes: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The one-to-one match of minimum cost of each prompt's queries to its instances, as (prompt, query,
    slot) rows (N, 3). logits (P, Q), boxes (P, Q, 4) cxcywh; truth (P, K, 4) cxcywh, of which valid (P, K)
    marks the prompt's instances. The costs are made on the device at once; one copy to the host."""
    prompts = truth.shape[0]
    prob = logits.float().sigmoid()
    cost = (-COST_CLASS * prob[..., None] + COST_BOX * torch.cdist(boxes.float(), truth.float(), p=1)
            - COST_GIOU * pairwise_giou(xyxy(boxes.float()), xyxy(truth.float()))).cpu()
    valid = valid.cpu()
    rows = []
    for p in range(prompts):
        slots_of = valid[p].nonzero().squeeze(1)
        if slots_of.numel() == 0:
            continue
        picked_queries, picked = linear_sum_assignment(cost[p][:, slots_of].numpy())
        rows += [(p, q, int(slots_of[k])) for q, k in zip(picked_queries, picked)]
    return torch.tensor(rows, dtype=torch.long).view(-1, 3)


def concept_loss(out: dict, truth_boxes: torch.Tensor, truth_masks: torch.Tensor,
                 valid: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The weighted loss of forward_grounding's outputs `out` for P prompts (or of an earlier decoder
    layer's, which have no pred_masks), and its parts (detached, on the device, for the log).
    truth_boxes (P, K, 4) cxcywh, truth_masks (P, K, M, M) in [0, 1] at the mask logits' resolution,
    valid (P, K): which of the K slots hold one of the prompt's instances."""
    logits = out["pred_logits"][..., 0]  # (P, Q)
    prompt, query, slot = match(logits, out["pred_boxes"], truth_boxes, valid).to(logits.device).unbind(1)
    instances = max(1, prompt.numel())
    target = torch.zeros_like(logits, dtype=torch.float32)
    target[prompt, query] = 1.0
    parts = {"class": sigmoid_focal_loss(logits.float(), target, alpha=CLASS_ALPHA, reduction="sum") / instances}
    boxes, gold_boxes = out["pred_boxes"][prompt, query].float(), truth_boxes[prompt, slot].float()
    parts["box"] = F.l1_loss(boxes, gold_boxes, reduction="sum") / instances
    parts["giou"] = generalized_box_iou_loss(xyxy(boxes), xyxy(gold_boxes), reduction="sum") / instances
    if prompt.numel() and "pred_masks" in out:
        focal, dice = mask_loss_table(out["pred_masks"][prompt, query][:, None], truth_masks[prompt, slot])
        parts["mask"] = (FOCAL_WEIGHT * focal + DICE_WEIGHT * dice).mean()
    else:  # no instance in the batch, or an earlier decoder layer's outputs (no masks): no mask to learn
        parts["mask"] = logits.sum() * 0.0
    present = valid.any(dim=1).float()
    parts["presence"] = F.binary_cross_entropy_with_logits(out["presence_logit_dec"][:, 0].float(), present)
    weights = dict(zip(LOSS_PARTS, (CLASS_WEIGHT, BOX_WEIGHT, GIOU_WEIGHT, MASK_WEIGHT, PRESENCE_WEIGHT)))
    loss = sum(weights[name] * parts[name] for name in LOSS_PARTS)
    return loss, {name: value.detach() for name, value in parts.items()}
