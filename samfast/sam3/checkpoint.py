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

from samfast.checkpoint import CheckpointError, load_file, refuse_layout_mismatch, resolve_checkpoint, unwrap_state_dict
from samfast.families import family_of_state_dict

MODEL_TYPE = "sam3"
DETECTOR_PREFIX = "detector."
TRACKER_PREFIX = "tracker."
INTERACTIVE_PREFIX = "inst_interactive_predictor.model."
# The neck's second branch, the SAM 2-style features the interactive predictor reads: every sam3.pt
# holds it, the image model builds it only with enable_inst_interactivity.
SAM2_NECK_PREFIX = "backbone.vision_backbone.sam2_convs."
IMAGE_KEY = "backbone.vision_backbone.trunk.patch_embed.proj.weight"  # in every SAM 3 image model
SAM3_KEY = DETECTOR_PREFIX + IMAGE_KEY  # in every sam3.pt
_FIX = "pass the path of sam3.pt (or its state dict), or seeded weights with checkpoint=None and seed=N"


def image_state_dict(checkpoint: Mapping[str, torch.Tensor], enable_inst_interactivity: bool = False) -> dict[str, torch.Tensor]:
    """A sam3.pt state dict in the image model's layout, as sam3's image loader maps it: `detector.` keys
    lose the prefix, `tracker.` keys go under `inst_interactive_predictor.model.` with interactivity and
    are left out without it, as is the neck's second branch (SAM2_NECK_PREFIX) that only interactivity
    builds. A key under neither prefix is kept as it is, so the strict check names it as unexpected."""
    state = {}
    for key, value in checkpoint.items():
        if key.startswith(DETECTOR_PREFIX):
            key = key[len(DETECTOR_PREFIX):]
            if not enable_inst_interactivity and key.startswith(SAM2_NECK_PREFIX):
                continue
        elif key.startswith(TRACKER_PREFIX):
            if not enable_inst_interactivity:
                continue
            key = INTERACTIVE_PREFIX + key[len(TRACKER_PREFIX):]
        state[key] = value
    return state


def refuse_non_sam3(state_dict: Mapping[str, torch.Tensor]) -> None:
    """CheckpointError for a state dict that is not sam3.pt's: a SAM 1 or SAM 2 one (naming its model
    type), one already in the image model's layout, or one of no SAM family."""
    other = family_of_state_dict(state_dict)
    if other is not None:
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


def check_weights_source(checkpoint: str | Path | Mapping | None, seed: int | None) -> None:
    """CheckpointError unless exactly one weight source is named: samfast downloads nothing, so where sam3
    would fetch sam3.pt (no checkpoint) a seed must be given, and a seed beside a checkpoint would be
    silently ignored."""
    if checkpoint is None and seed is None:
        raise CheckpointError(
            "no checkpoint given and samfast downloads no weights: seeded weights need seed=N (e.g. seed=0), "
            "or pass the path of sam3.pt."
        )
    if checkpoint is not None and seed is not None:
        raise CheckpointError(
            f"both a checkpoint and seed={seed} given: the seed only makes seeded synthetic weights; "
            "drop seed to load the checkpoint, or pass checkpoint=None for seeded weights."
        )
