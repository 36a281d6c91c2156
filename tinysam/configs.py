"""The model families tinysam trains: what differs between them, one entry each.

A family names the model that samfast builds (from its seeded random init), the file its weights
are saved to and what that file holds, the accuracy a run should reach, and the defaults of the
training flags for a full run. The scene pool, sampler, loss, validation, loop and outputs are
shared. vit_tiny (SAM 1) is the one trained today; a SAM 2 family adds its own entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelFamily:
    model_type: str  # samfast.build_sam's name
    checkpoint_name: str  # the weights file written to --out; the manifest has the same stem, .json
    state_dict_layout: str  # whose loader reads the file (recorded in the manifest)
    fp32_keys: tuple[str, ...]  # state-dict entries kept in fp32 in the otherwise fp16 file
    target_miou: float  # held-out mIoU (centre point, best of 3 masks) a full run should reach
    settings: dict  # defaults of the training flags (--pool, --batch, ...) for a full run; --smoke overrides them

    @property
    def manifest_name(self) -> str:
        return Path(self.checkpoint_name).with_suffix(".json").name


VIT_TINY = ModelFamily(
    model_type="vit_tiny",
    checkpoint_name="vit_tiny_trained.pt",
    state_dict_layout="official segment_anything state dict",
    # The prompt encoder's Fourier frequencies multiply coordinates by 2*pi before sin/cos, where
    # fp16 rounding would move every encoding (2 x 128 values, 1 KB).
    fp32_keys=("prompt_encoder.pe_layer.positional_encoding_gaussian_matrix",),
    target_miou=0.85,
    settings=dict(pool=4000, batch=16, prompts=8, lr=1e-3, weight_decay=0.1, warmup=100),
)
