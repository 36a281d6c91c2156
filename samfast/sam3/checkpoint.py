"""SAM 3 checkpoints: sam3.pt, read into the image model's key layout, strictly.

sam3.pt is the video model's state dict: the detector (the image model) under `detector.`, the tracker
under `tracker.`. sam3's image loader (sam3.model_builder._load_checkpoint) strips `detector.` and,
when the image model has its instance-interactivity predictor, moves `tracker.` under
`inst_interactive_predictor.model.`; it then loads with strict=False, so a wrong file loads silently
as random weights. Here the same mapping is followed by a strict check that names every missing,
unexpected or misshapen key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from torch import nn

from samfast.checkpoint import (
    CheckpointError,
    key_generator,
    load_file,
    refuse_layout_mismatch,
    resolve_checkpoint,
    unwrap_state_dict,
)
from samfast.families import family_of_state_dict
from samfast.modeling.common import LayerNorm2d
from samfast.modeling.prompt_encoder import PositionEmbeddingRandom
from samfast.sam3.config import CONFIGS, Sam3Config, build_image_model, model_type_of, sam3_config
from samfast.sam3.vit import Attention as VitAttention

MODEL_TYPE = "sam3"
DETECTOR_PREFIX = "detector."
TRACKER_PREFIX = "tracker."
INTERACTIVE_PREFIX = "inst_interactive_predictor.model."
# The neck's second branch, the SAM 2-style features the interactive predictor reads: every sam3.pt
# holds it, the image model builds it only with enable_inst_interactivity.
SAM2_NECK_PREFIX = "backbone.vision_backbone.sam2_convs."
# The tracker's parts that only video uses (the memory attention and encoder, the object pointers): sam3
# builds them into its interactive predictor and never runs them for images; samfast's image model holds
# the heads alone (samfast.sam3.interactive), so these keys of sam3.pt are left out, by name, and any
# other tracker key must be the heads'.
TRACKER_VIDEO_PARTS = frozenset({"transformer", "maskmem_backbone", "maskmem_tpos_enc", "mask_downsample",
                                 "no_mem_pos_enc", "no_obj_embed_spatial", "no_obj_ptr", "obj_ptr_proj",
                                 "obj_ptr_tpos_proj"})
IMAGE_KEY = "backbone.vision_backbone.trunk.patch_embed.proj.weight"  # in every SAM 3 image model
SAM3_KEY = DETECTOR_PREFIX + IMAGE_KEY  # in every sam3.pt
_FIX = "pass the path of sam3.pt (or its state dict), or seeded weights with checkpoint=None and seed=N"


def image_state_dict(checkpoint: Mapping[str, torch.Tensor], enable_inst_interactivity: bool = False) -> dict[str, torch.Tensor]:
    """A sam3.pt state dict in the image model's layout, as sam3's image loader maps it: `detector.` keys
    lose the prefix, `tracker.` keys go under `inst_interactive_predictor.model.` with interactivity (but
    TRACKER_VIDEO_PARTS') and are left out without it, as is the neck's second branch (SAM2_NECK_PREFIX)
    that only interactivity builds. A key under neither prefix is kept as it is, so the strict check
    names it as unexpected."""
    state = {}
    for key, value in checkpoint.items():
        if key.startswith(DETECTOR_PREFIX):
            key = key[len(DETECTOR_PREFIX):]
            if not enable_inst_interactivity and key.startswith(SAM2_NECK_PREFIX):
                continue
        elif key.startswith(TRACKER_PREFIX):
            key = key[len(TRACKER_PREFIX):]
            if not enable_inst_interactivity or of_video_only(key):
                continue
            key = INTERACTIVE_PREFIX + key
        state[key] = value
    return state


def of_video_only(tracker_key: str) -> bool:
    """Whether a tracker key (without `tracker.`) is of a part only video uses (TRACKER_VIDEO_PARTS)."""
    return tracker_key.split(".")[0] in TRACKER_VIDEO_PARTS


def refuse_non_sam3(state_dict: Mapping[str, torch.Tensor]) -> None:
    """CheckpointError for a state dict that is not sam3.pt's: a SAM 1 or SAM 2 one (naming its model
    type), one already in the image model's layout, or one of no SAM family."""
    other = family_of_state_dict(state_dict)
    if other is not None and other.state_dict_key != SAM3_KEY:
        found = other.infer_model_type(state_dict)[0]
        use = f"use model type {found!r} (build_sam({found!r}, checkpoint=...))" if found else (
            f"it is of no {other.name} model type samfast knows"
        )
        raise CheckpointError(f"this is a {other.name} checkpoint, not a SAM 3 one: {use}; for {MODEL_TYPE}, {_FIX}.")
    if SAM3_KEY in state_dict:
        return
    if IMAGE_KEY in state_dict:
        raise CheckpointError(
            f"this state dict is in the image model's own layout (it has {IMAGE_KEY!r}, not sam3.pt's {SAM3_KEY!r}): "
            f"save it as sam3.pt does, every key of the image model under {DETECTOR_PREFIX!r} and of its "
            f"interactive predictor's model under {TRACKER_PREFIX!r}; or {_FIX}."
        )
    raise CheckpointError(f"this state dict holds no SAM 3 detector (no {SAM3_KEY!r} key): {_FIX}.")


def read_sam3_checkpoint(
    checkpoint: str | Path | Mapping,
    expected: Mapping[str, torch.Size],
    enable_inst_interactivity: bool = False,
) -> dict[str, torch.Tensor]:
    """The image model's state dict from sam3.pt (a path, or the loaded dict; its state dict at the top
    level or under "model"), checked to hold exactly the keys and shapes of `expected` (the image
    model's, built with the same enable_inst_interactivity): CheckpointError otherwise."""
    if isinstance(checkpoint, Mapping):
        state = checkpoint
    else:
        path = resolve_checkpoint(checkpoint, MODEL_TYPE)
        state = load_file(path)
        if not isinstance(state, Mapping):
            raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict: {_FIX}.")
    state = unwrap_state_dict(state)
    refuse_non_sam3(state)
    mapped = image_state_dict(state, enable_inst_interactivity)
    refuse_layout_mismatch(mapped, expected, f"{MODEL_TYPE} (enable_inst_interactivity={enable_inst_interactivity})")
    return mapped


TRUNK_BLOCKS = DETECTOR_PREFIX + "backbone.vision_backbone.trunk.blocks."


def infer_sam3_model_type(state_dict: Mapping[str, torch.Tensor]) -> tuple[str | None, int, int]:
    """(model type or None, trunk width, trunk depth) read off a sam3.pt-layout state dict."""
    width = state_dict[SAM3_KEY].shape[0]
    depth = len({k[len(TRUNK_BLOCKS):].split(".")[0] for k in state_dict if k.startswith(TRUNK_BLOCKS)})
    found = next((name for name, c in CONFIGS.items() if (c.vit_embed_dim, c.vit_depth) == (width, depth)), None)
    return found, width, depth


def check_sam3_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: Sam3Config, expected: Mapping[str, torch.Size]
) -> None:
    """Refuse a state dict that is not sam3.pt's, or one whose image model differs from `config`'s
    (missing, unexpected or misshapen keys after sam3's own key mapping)."""
    refuse_non_sam3(state_dict)
    wanted = model_type_of(config)
    found, width, depth = infer_sam3_model_type(state_dict)
    if found != wanted:
        what = found or f"a SAM 3 of trunk width {width} and {depth} blocks, of no model type samfast knows"
        raise CheckpointError(f"this checkpoint is {what}; you asked for {wanted}. "
                              + (f"Call build_sam({found!r}, checkpoint=...), or {_FIX}." if found else f"{_FIX[0].upper()}{_FIX[1:]}."))
    refuse_layout_mismatch(model_layout(state_dict, expected), expected, wanted)


def model_layout(state_dict: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size] | None = None) -> dict[str, torch.Tensor]:
    """sam3.pt's state dict as the image model whose keys are `expected` names it: with the interactive
    predictor's keys when that model has them (enable_inst_interactivity), without them otherwise or
    when `expected` is not given."""
    interactive = expected is not None and any(key.startswith(INTERACTIVE_PREFIX) for key in expected)
    return image_state_dict(state_dict, enable_inst_interactivity=interactive)


def synthetic_state_dict(model_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights for a SAM 3 model type, in sam3.pt's layout: the detector's keys (the
    neck's second branch too) and the tracker's that predict_inst reads (not TRACKER_VIDEO_PARTS').

    As SAM 1's and SAM 2's: every tensor from its own generator seeded by (seed, key), fan-in scales
    for projections (their packed in_proj_weight too) so activations stay O(1), norms near identity,
    N(0, 1) token embeddings and random-Fourier position table, small other tables; the ViT's RoPE
    tables are computed, as a checkpoint holds them. Built on the meta device: nothing but the returned tensors is allocated."""
    with torch.device("meta"):
        model = build_image_model(sam3_config(model_type), tokenizer=lambda phrases: None, enable_inst_interactivity=True)
    state = {}
    for module_name, module in model.named_modules():
        prefix = f"{DETECTOR_PREFIX}{module_name}." if module_name else DETECTOR_PREFIX
        if prefix.startswith(DETECTOR_PREFIX + INTERACTIVE_PREFIX):
            prefix = TRACKER_PREFIX + prefix[len(DETECTOR_PREFIX + INTERACTIVE_PREFIX):]
        for leaf, tensor in module.named_parameters(recurse=False):
            key = prefix + leaf
            noise = torch.randn(tensor.shape, generator=key_generator(seed, key))
            if isinstance(module, (nn.LayerNorm, nn.GroupNorm, LayerNorm2d)):
                state[key] = 1.0 + 0.02 * noise if leaf == "weight" else 0.02 * noise
            elif isinstance(module, nn.Embedding):
                state[key] = noise
            elif leaf.endswith("bias"):
                state[key] = 0.02 * noise
            elif leaf == "in_proj_weight" or (tensor.ndim >= 2 and isinstance(module, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d))):
                in_features = tensor.shape[0] if isinstance(module, nn.ConvTranspose2d) else tensor.shape[1]
                state[key] = noise / (in_features * tensor.shape[2:].numel()) ** 0.5
            else:  # positional tables, query embeddings, the presence token, the text projection
                state[key] = 0.05 * noise
        persistent = set(module.state_dict(keep_vars=True)) & {name for name, _ in module.named_buffers(recurse=False)}
        for leaf in sorted(persistent):
            if isinstance(module, VitAttention) and leaf == "freqs_cis":
                with torch.device("cpu"):
                    state[prefix + leaf] = module.rope_table()
            elif isinstance(module, PositionEmbeddingRandom):  # N(0, 1), as sam2 and sam3 draw it
                state[prefix + leaf] = torch.randn(module.positional_encoding_gaussian_matrix.shape,
                                                   generator=key_generator(seed, prefix + leaf))
            else:
                raise TypeError(f"{prefix}{leaf}: a saved buffer synthetic_state_dict does not know how to make")
    return state
