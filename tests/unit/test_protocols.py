"""The protocols a family's model implements, held to the models that implement them: the switch target
(samfast.stages.SwitchTarget) for every family, the tracker (samfast.video.Tracker) for those that track.

typing.Protocol checks nothing at run time (and runtime_checkable only the names of methods), so a
model that lost a member would fail only on the first switch or video that reads it: here every member
the protocol declares must be on the model built for each family's smallest type.
"""

from __future__ import annotations

import pytest
import torch

import samfast
from samfast.stages import SwitchTarget
from samfast.video import Tracker


def protocol_members(protocol: type) -> list[str]:
    """The attributes, properties and methods a protocol declares (its own, not object's or Protocol's)."""
    declared = set(getattr(protocol, "__annotations__", {})) | {name for name in vars(protocol) if not name.startswith("_")}
    return sorted(declared)


def missing_members(model: object, protocol: type) -> list[str]:
    return [name for name in protocol_members(protocol) if not hasattr(model, name)]


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {model_type: samfast.build_sam(model_type, device="cpu") for model_type in ("vit_tiny", "sam2.1_hiera_nano")}


@pytest.mark.parametrize("model_type", ["vit_tiny", "sam2.1_hiera_nano"])
def test_every_family_is_a_switch_target(models, model_type):
    assert missing_members(models[model_type], SwitchTarget) == []


def test_sam2_is_a_tracker(models):
    assert missing_members(models["sam2.1_hiera_nano"], Tracker) == []


def test_protocols_declare_what_their_callers_use():
    """The members read by apply_stages and by the video predictor are all declared (a few, by name)."""
    assert {"image_encoder", "switches", "device", "prompt_decoder", "memory_cross_attentions"} <= set(
        protocol_members(SwitchTarget))
    assert {"image_size", "num_maskmem", "track_step", "encode_memory", "frame_features"} <= set(
        protocol_members(Tracker))


def test_planted_missing_member_is_reported(models):
    """A model without one of the tracker's methods (a family that kept sam2's private name only)."""

    class WithoutEncodeMemory:
        def __init__(self, model):
            self.model = model

        def __getattr__(self, name):
            if name == "encode_memory":
                raise AttributeError(name)
            return getattr(self.model, name)

    assert missing_members(WithoutEncodeMemory(models["sam2.1_hiera_nano"]), Tracker) == ["encode_memory"]
