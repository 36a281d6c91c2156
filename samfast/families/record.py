"""Family: what samfast knows of one model family, so that the shared code (building, checkpoint
checks, stages, bench, the CLI, tinysam) asks the record instead of asking which family it is."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

StateDict = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Family:
    name: str  # in messages: "SAM 1", "SAM 2"
    model_types: tuple[str, ...]
    config: Callable[[str], Any]  # model type -> its hyper-parameters (a ValueError for another type)
    build_modules: Callable[..., nn.Module]  # (config, **options) -> the model, its weights not loaded yet
    synthetic_state_dict: Callable[[str, int], dict[str, torch.Tensor]]  # (model type, seed) -> seeded weights
    # (state dict, config, the model's shapes by key): CheckpointError for one this model type cannot load
    check_state_dict: Callable[[StateDict, Any, Mapping[str, torch.Size]], None]
    state_dict_key: str  # a key every state dict of the family holds and no other family's does
    infer_model_type: Callable[[StateDict], tuple[str | None, int, int]]  # -> (type or None, width, depth)
    built_switches: frozenset[str]  # the samfast.stages switches build_sam takes for the family
    reference: str  # the package whose fp32 outputs samfast's equal: the goldens' and the bench's reference
    tasks: frozenset[str]  # the parity tasks (parity.tasks.registry) the family supports
    official_checkpoint: str  # the official file names of a model type, "{model_type}" filled in: for messages
    # (state dict, the model's shapes by key) -> the checkpoint's state dict as the model names its keys
    # (SAM 3's sam3.pt nests the image model under "detector.", and what of its tracker the model holds
    # depends on how it was built); the same dict where the two layouts are one
    model_layout: Callable[[StateDict, Mapping[str, torch.Size]], Mapping[str, torch.Tensor]] = lambda state, expected: state
    # the seed of build_sam(checkpoint=None) when none is given; None: seeded weights need seed=N
    # (where the reference would download the official weights, random ones must be asked for)
    default_seed: int | None = 0

    def supports(self, task: str) -> bool:
        return task in self.tasks
