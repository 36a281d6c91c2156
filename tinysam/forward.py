"""Each family's training forward: the image features of a batch, then all four masks of every
prompt (point or box, over several images) with their IoU predictions, in as few decoder passes
as the family's prompt tokens allow. tinysam.configs pairs each family with its functions here."""

from __future__ import annotations

import torch


def sam_features(model):
    """SAM 1's image encoder: (B, 3, 1024, 1024) normalised images -> (B, 256, 64, 64) embeddings."""
    return model.image_encoder


def decode_prompts(model, embeddings: torch.Tensor, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """All 4 mask logits (P, 4, 256, 256) and IoU predictions (P, 4) for a mix of point and box
    prompts over several images, in one decoder pass. A point prompt (point + SAM's padding
    "not a point") and a box (two corners) are both two sparse tokens, so they share a batch."""
    pe = model.prompt_encoder
    # Outside autocast: the Fourier features are sin/cos of arguments up to ~100, which bf16
    # matmuls would scramble (the prompt encoder keeps them fp32 in every samfast stage, too).
    with torch.autocast(embeddings.device.type, enabled=False):
        labels = torch.ones(inputs["points"].shape[:2], dtype=torch.int, device=embeddings.device)
        point_tokens, dense = pe(points=(inputs["points"], labels), boxes=None, masks=None)
        box_tokens, _ = pe(points=None, boxes=inputs["boxes"], masks=None)
        sparse = torch.where(inputs["is_box"][:, None, None], box_tokens, point_tokens)
        image_pe = pe.get_dense_pe()
    return model.mask_decoder.predict_masks(embeddings, image_pe, sparse, dense, inputs["image_index"])


def sam2_features(model):
    """SAM 2's image path as its image predictor runs it (SAM2Base.image_features): normalised
    (B, 3, 1024, 1024) images -> (the (B, 256, 64, 64) embedding with no_mem_embed added, [the
    stride-4 and stride-8 levels, already through the decoder's conv_s0 / conv_s1])."""
    return model.image_features


def fade_high_res(features: tuple[torch.Tensor, list[torch.Tensor]], weight: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """SAM 2's features with the stride-4 and stride-8 levels scaled by weight (0 to 1).

    Why: on an H100, a 5.5-minute run without the fade stopped at held-out mIoU 0.12, points and
    boxes alike: masks that ignore the prompt, about "every object of the image" on these scenes
    (objects on plain backgrounds), where vit_tiny goes on to pick the prompted object. The
    decoder adds these levels, the same for every prompt of an image, into its upscaling, so they
    offer that mask without the prompt path; SAM 1's decoder has no such inputs. Faded in over
    the first steps (the family's high_res_fade_in), the prompt path through the image embedding
    would be learned first, as SAM 1 learns it; the rest of the run, and every validation, use
    them at full weight, as the predictor does. A hypothesis: no GPU run has measured the fade yet.
    """
    embeddings, high_res = features
    return embeddings, [weight * level for level in high_res]


def decode_sam2_prompts(model, features: tuple[torch.Tensor, list[torch.Tensor]],
                        inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All 4 mask logits (P, 4, 256, 256), IoU predictions (P, 4) and object-score logits (P, 1)
    of SAM 2's decoder, for prompts that the sampler grouped points first (group_kinds=True).

    The prompts are encoded as sam2 encodes them (SAM2ImagePredictor._decode, SAM2Base's
    _forward_sam_heads): a point is the point plus one "not a point" padding token; a box is its
    two corners as points labelled 2 and 3, plus the same padding. So a point prompt is 2 tokens
    and a box 3: they cannot share one token batch, and the decoder runs once per kind present.
    """
    embeddings, high_res = features
    num_points = inputs["num_points"]  # a host int: slicing by it needs no device sync
    points = inputs["points"]  # (P, 1, 2)
    corners = inputs["boxes"].reshape(-1, 2, 2)
    kinds = []
    if num_points > 0:
        labels = torch.ones((num_points, 1), dtype=torch.int, device=points.device)
        kinds.append((slice(0, num_points), points[:num_points], labels))
    if num_points < len(points):
        labels = torch.tensor([[2, 3]], dtype=torch.int, device=points.device).expand(len(points) - num_points, 2)
        kinds.append((slice(num_points, None), corners[num_points:], labels))
    pe, decoder = model.sam_prompt_encoder, model.sam_mask_decoder
    # Outside autocast, as for SAM 1 (decode_prompts): sin/cos of the Fourier features in fp32.
    with torch.autocast(embeddings.device.type, enabled=False):
        image_pe = pe.get_dense_pe()
    outputs = []
    for rows, coords, labels in kinds:
        with torch.autocast(embeddings.device.type, enabled=False):
            sparse, dense = pe(points=(coords, labels), boxes=None, masks=None)
        # One image embedding per prompt (repeat_image=False): the prompts of a batch come from
        # several images, and SAM 2's decoder adds the high-resolution levels per prompt too.
        index = inputs["image_index"][rows]
        masks, iou_pred, _, object_logits = decoder.predict_masks(
            embeddings[index], image_pe, sparse, dense, repeat_image=False,
            high_res_features=[level[index] for level in high_res])
        outputs.append((masks, iou_pred, object_logits))
    return tuple(torch.cat(parts) for parts in zip(*outputs))
