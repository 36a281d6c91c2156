"""The model families tinysam trains: what differs between them, one entry each.

A family names the model that samfast builds (from its seeded random init), the file its weights
are saved to and what that file holds, the accuracy a run should reach, and the defaults of the
training flags for a full run; and the few steps that differ per family, as small functions
picked here: its input frame (tinysam.frames: resize, normalisation, how validation sets an
image), its training forward (tinysam.forward) and its loss (tinysam.losses). The scene pool,
sampler, targets, optimizer, validation, loop and outputs are shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tinysam.forward import decode_prompts, decode_sam2_prompts, fade_high_res, sam2_features, sam_features
from tinysam.frames import LONGEST_SIDE, STRETCHED, LongestSide, Stretched
from tinysam.losses import sam2_loss, sam_loss


@dataclass(frozen=True)
class ModelFamily:
    model_type: str  # samfast.build_sam's name
    checkpoint_name: str  # the weights file written to --out; the manifest has the same stem, .json
    state_dict_layout: str  # whose loader reads the file (recorded in the manifest)
    fp32_keys: tuple[str, ...]  # state-dict entries kept in fp32 in the otherwise fp16 file
    target_miou: float  # held-out mIoU (centre point, best of 3 masks) a full run should reach
    settings: dict  # defaults of the training flags (--pool, --batch, ...) for a full run; --smoke overrides them
    frame: LongestSide | Stretched  # how images and prompts enter the model (tinysam.frames)
    features: Callable  # model -> the callable that turns a batch of normalised images into decoder features
    decode: Callable  # (model, features, inputs) -> (mask logits (P, 4, 256, 256), IoU predictions (P, 4), ...)
    loss: Callable  # (*decode's outputs, targets) -> (loss, its logged parts)
    group_kinds: bool = False  # the sampler gives every batch the same box count, after the points (tinysam.data)
    # features -> features at a weight in [0, 1] rising over the first high_res_fade_in of the steps
    # (SAM 2: tinysam.forward.fade_high_res); applied in training only
    fade_in: Callable | None = None
    wrap_key: str | None = None  # the checkpoint file holds {wrap_key: state dict}, not the state dict
    # The log and curve written beside the checkpoint: a family's own names where runs share --out.
    log_name: str = "training_log.csv"
    curve_name: str = "training_curve.png"

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
    frame=LONGEST_SIDE,
    features=sam_features,
    decode=decode_prompts,
    loss=sam_loss,
)

# The project's own small SAM 2 (samfast.sam2.config): Hiera of width 32, one block per stage plus
# a global one. Only the image path trains (trunk, neck, no_mem_embed, prompt encoder, decoder with
# its object-score head); the video modules (memory attention and encoder, object pointers) keep
# their seeded init, saved as they are so that the file loads strictly, and tinysam.train_tracking
# then trains them on generated clips (the packaged file is both runs').
SAM2_NANO = ModelFamily(
    model_type="sam2.1_hiera_nano",
    checkpoint_name="sam2.1_hiera_nano_trained.pt",
    state_dict_layout="official sam2 checkpoint ({'model': state dict})",
    fp32_keys=("sam_prompt_encoder.pe_layer.positional_encoding_gaussian_matrix",),  # as vit_tiny's
    target_miou=0.80,
    # embedding_mean_penalty: what lets the nano train (why and what it measured: tinysam.losses.embedding_mean_penalty)
    settings=dict(pool=4000, batch=16, prompts=8, lr=1e-3, weight_decay=0.1, warmup=100, high_res_fade_in=0.4,
                  embedding_mean_penalty=0.1),
    frame=STRETCHED,
    features=sam2_features,
    decode=decode_sam2_prompts,
    loss=sam2_loss,
    group_kinds=True,  # a SAM 2 point prompt is 2 tokens, a box 3 (decode_sam2_prompts)
    fade_in=fade_high_res,
    wrap_key="model",
    # Its own names: both packaged runs write to samfast/weights, where vit_tiny's keep the plain ones.
    log_name="sam2.1_hiera_nano_training_log.csv",
    curve_name="sam2.1_hiera_nano_training_curve.png",
)

FAMILIES = {family.model_type: family for family in (VIT_TINY, SAM2_NANO)}
