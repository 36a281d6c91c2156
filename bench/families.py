"""What differs between the model families in the benchmarks, chosen by model type: the reference
package and how it is built with samfast's seeded weights, the stages samfast builds for the
family, and the automatic mask generator's default thresholds. The benchmarks themselves
(bench.ladder, bench.amg) have one code path for both families.
"""

from __future__ import annotations

import torch

import samfast
from samfast.build import built_switches, check_stages
from samfast.errors import StageError
from samfast.sam2.config import is_sam2_type
from samfast.stages import parse_stages

MODEL_TYPES = (*samfast.MODEL_TYPES, *samfast.SAM2_MODEL_TYPES)
SEED = 0  # the seeded synthetic weights every implementation loads
# The generators' default pred_iou_thresh and stability_score_thresh: segment_anything's
# SamAutomaticMaskGenerator and sam2's SAM2AutomaticMaskGenerator (samfast's of each family the same)
DEFAULT_THRESHOLDS = {False: (0.88, 0.95), True: (0.8, 0.95)}  # keyed by is_sam2_type


def reference_name(model_type: str) -> str:
    return "sam2" if is_sam2_type(model_type) else "segment_anything"


def family_name(model_type: str) -> str:
    return "SAM 2" if is_sam2_type(model_type) else "SAM 1"


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
    from parity.reference import reference_sam, reference_sam2

    state = samfast.synthetic_state_dict(model_type, seed=SEED)
    if not is_sam2_type(model_type):
        if compile_mode is not None:
            raise ValueError("segment_anything has no compiled image encoder")
        return reference_sam(model_type, state).to(device)
    extra = [] if compile_mode is None else ["++model.compile_image_encoder=True"]
    model = reference_sam2(model_type, state, device, extra)
    if compile_mode not in (None, SAM2_COMPILE_MODE):
        encoder = model.image_encoder
        del encoder.forward  # sam2's compiled wrapper, an instance attribute: the class's forward is back
        encoder.forward = torch.compile(encoder.forward, mode=compile_mode, fullgraph=True, dynamic=False)
    return model
