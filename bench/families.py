"""What differs between the model families in the benchmarks, read off the model type's family
record (samfast.families) and keyed by its reference package: how the reference is built with
samfast's seeded weights, the stages samfast builds for the family, and the automatic mask
generator's default thresholds. The benchmarks themselves (bench.ladder, bench.amg) have one code
path for every family.
"""

from __future__ import annotations

import torch

import samfast
from samfast.build import built_switches, check_stages
from samfast.errors import StageError
from samfast.families import family_of, model_types
from samfast.stages import parse_stages

MODEL_TYPES = model_types()
SEED = 0  # the seeded synthetic weights every implementation loads
# The generators' default pred_iou_thresh and stability_score_thresh, by reference package: segment_anything's
# SamAutomaticMaskGenerator and sam2's SAM2AutomaticMaskGenerator (samfast's of each family the same)
DEFAULT_THRESHOLDS = {"segment_anything": (0.88, 0.95), "sam2": (0.8, 0.95)}


def reference_name(model_type: str) -> str:
    return family_of(model_type).reference


def by_reference(table: dict, model_type: str):
    """table's entry for the reference package of model_type's family; ValueError naming what to add for
    a family the benchmarks do not know yet."""
    reference = reference_name(model_type)
    if reference not in table:
        raise ValueError(f"the benchmarks know no {reference} reference ({family_name(model_type)}, {model_type}): "
                         f"add its entry beside those of {', '.join(table)} in bench/")
    return table[reference]


def family_name(model_type: str) -> str:
    return family_of(model_type).name


def built_stages(model_type: str, stages: list[str]) -> list[str]:
    """The stages of `stages` that samfast builds for the model's family (all of them for SAM 1)."""
    return [stage for stage in stages if parse_stages(stage) <= built_switches(model_type)]


def not_built(model_type: str, stage: str) -> str | None:
    """Why build_sam(model_type, stages=stage) would refuse the stage, or None: checked before anything is built."""
    try:
        check_stages(model_type, stage)
    except StageError as err:
        return f"not built for {family_name(model_type)}: {' '.join(str(err).split())}"
    return None


SAM2_COMPILE_MODE = "max-autotune"  # what sam2's compile_image_encoder passes to torch.compile


def reference_model(model_type: str, device: torch.device, *, compile_mode: str | None = None):
    """The reference package's model of `model_type` with samfast's seeded weights, on `device`, as shipped.

    SAM 1: segment_anything's Sam. SAM 2: sam2's build_sam2 (hydra overrides for a model type sam2
    ships no config for), loaded strictly. compile_mode (SAM 2 only): sam2's own switch,
    ++model.compile_image_encoder=True, which wraps the image encoder's forward in
    torch.compile(mode="max-autotune", fullgraph=True, dynamic=False); another mode makes the same
    call with that mode (so a run that compiles samfast in another mode compiles both alike).
    """
    state = samfast.synthetic_state_dict(model_type, seed=SEED)
    return by_reference(REFERENCE_MODELS, model_type)(model_type, state, device, compile_mode)


def _segment_anything_model(model_type: str, state: dict, device: torch.device, compile_mode: str | None):
    from parity.reference import reference_sam

    if compile_mode is not None:
        raise ValueError("segment_anything has no compiled image encoder")
    return reference_sam(model_type, state).to(device)


def _sam2_model(model_type: str, state: dict, device: torch.device, compile_mode: str | None):
    from parity.reference import reference_sam2

    extra = [] if compile_mode is None else ["++model.compile_image_encoder=True"]
    model = reference_sam2(model_type, state, device, extra)
    if compile_mode not in (None, SAM2_COMPILE_MODE):
        encoder = model.image_encoder
        del encoder.forward  # sam2's compiled wrapper, an instance attribute: the class's forward is back
        encoder.forward = torch.compile(encoder.forward, mode=compile_mode, fullgraph=True, dynamic=False)
    return model


REFERENCE_MODELS = {"segment_anything": _segment_anything_model, "sam2": _sam2_model}  # by reference package
