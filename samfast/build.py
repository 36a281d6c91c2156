"""build_sam: a model of any registered family (samfast.families), from an official checkpoint or
seeded synthetic weights, at a ladder stage."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from samfast.checkpoint import CheckpointError, read_checkpoint, unwrap_state_dict
from samfast.errors import StageError
from samfast.families import family_of
from samfast.stages import SWITCHES, apply_stages, parse_stages


def build_sam(
    model_type: str,
    checkpoint: str | Path | Mapping | None = None,
    *,
    seed: int | None = None,
    device: str | torch.device | None = None,
    stages: str = "fp32",
    batch_size: int = 8,
    **module_options,
) -> nn.Module:
    """A ready-to-run model of `model_type` in eval mode: a Sam (samfast.sam1), a SAM2Base (samfast.sam2)
    or a Sam3ImageModel (samfast.sam3).

    checkpoint: path of an official file (sam_vit_*.pth, sam2.1_hiera_*.pt, sam3.pt) or any state dict
    in its layout, bare or as {"model": state_dict}, or such a dict itself; "trained" for the model
    type's packaged trained file; None for `synthetic_state_dict(model_type, seed)` (seed 0 when none
    is given for SAM 1 and SAM 2; SAM 3 asks for one, as sam3 would download its weights). stages: a ladder name
    or switches joined by '+' (see samfast.LADDER), of those the family builds (built_switches).
    batch_size: with the compile switch the encoder always runs batches of exactly this size
    (smaller ones padded, larger ones split), so it never recompiles. module_options: the family's
    build_modules keywords (SAM 2: dynamic_multimask_via_stability; SAM 3: enable_inst_interactivity).
    """
    family = family_of(model_type)
    config = family.config(model_type)
    switches = parse_stages(stages)
    check_stages(model_type, stages)
    if checkpoint is not None and seed is not None:
        # the checkpoint's weights would be loaded and the seed ignored: a caller asking for both wants one
        raise CheckpointError(
            f"build_sam({model_type!r}) got both a checkpoint and seed={seed}: a seed picks synthetic weights, "
            "which a checkpoint replaces; pass one of them (checkpoint=None, seed=N for seeded weights)."
        )
    model = family.build_modules(config, **module_options)
    if checkpoint is None:
        seed = family.default_seed if seed is None else seed
        if seed is None:
            raise CheckpointError(
                f"no checkpoint given for {model_type} and samfast downloads no weights: seeded weights need "
                f"seed=N (e.g. build_sam({model_type!r}, seed=0)), or pass the path of "
                f"{family.official_checkpoint.format(model_type=model_type)}."
            )
        state = family.synthetic_state_dict(model_type, seed)
    elif isinstance(checkpoint, Mapping):
        state = unwrap_state_dict(checkpoint)
    else:
        state = read_checkpoint(checkpoint, model_type)  # unwraps {"model": ...} too
    expected = {k: v.shape for k, v in model.state_dict().items()}
    family.check_state_dict(state, config, expected)
    model.load_state_dict(family.model_layout(state, expected))
    model.eval().requires_grad_(False)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.static_batch = batch_size if "compile" in switches else None
    if family.built_switches:
        apply_stages(model, switches)
    else:  # fp32 only (check_stages refused the rest): a model that offers no switch target yet
        model.switches = switches
    return model


def synthetic_state_dict(model_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded synthetic weights for a model type of any family, in its official state-dict layout."""
    return family_of(model_type).synthetic_state_dict(model_type, seed)


def built_switches(model_type: str) -> frozenset[str]:
    """The switches `build_sam(model_type, stages=...)` takes: all of them for SAM 1, fewer for SAM 2 so far."""
    return family_of(model_type).built_switches


def check_stages(model_type: str, stages: str) -> None:
    """StageError, before any model is built, for a stage `build_sam(model_type, stages=...)` would
    refuse: a bad stage name, or switches not built for the family, naming the stage to ask for instead."""
    switches = parse_stages(stages)
    family = family_of(model_type)
    if unbuilt := sorted(switches - family.built_switches, key=SWITCHES.index):
        built = sorted(switches & family.built_switches, key=SWITCHES.index)
        # one name alone is a rung of SAM 1's cumulative ladder: "fp32+" keeps it exactly that switch
        instead = "+".join(built) if len(built) > 1 else "+".join(["fp32", *built])
        takes = (f"fp32 and any combination of {', '.join(sorted(family.built_switches, key=SWITCHES.index))}"
                 if family.built_switches else "fp32 only so far")
        raise StageError(
            f"stages={stages!r}: the {', '.join(unbuilt)} switch(es) are not built for {family.name} yet; "
            f"{model_type} takes {takes}: use {instead!r} for the built part of this stage"
        )
