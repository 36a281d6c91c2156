"""Hyper-parameters of each SAM 1 model type (the published ones, plus vit_tiny for CPU tests and
vit_b_2block for the GPU correctness layers)."""

from __future__ import annotations

from dataclasses import dataclass

from samfast.config import IMAGE_SIZE

__all__ = ["IMAGE_SIZE", "MODEL_CONFIGS", "MODEL_TYPES", "ModelConfig", "model_config"]

PATCH_SIZE = 16
PROMPT_EMBED_DIM = 256
PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)


@dataclass(frozen=True)
class ModelConfig:
    name: str
    embed_dim: int
    depth: int
    num_heads: int
    global_attn_indexes: tuple[int, ...]
    window_size: int = 14

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


MODEL_CONFIGS: dict[str, ModelConfig] = {
    "vit_h": ModelConfig("vit_h", 1280, 32, 16, (7, 15, 23, 31)),
    "vit_l": ModelConfig("vit_l", 1024, 24, 16, (5, 11, 17, 23)),
    "vit_b": ModelConfig("vit_b", 768, 12, 12, (2, 5, 8, 11)),
    # Same code paths as the real models (64x64 tokens, windowed + global blocks, rel-pos,
    # head dim 64, full prompt encoder and mask decoder) at a size a CPU runs in about a second.
    "vit_tiny": ModelConfig("vit_tiny", 128, 4, 2, (1, 3)),
    # For the GPU correctness layers (tests/gpu: stages, syncs, kernels) only; no official checkpoint
    # exists (seeded synthetic weights). vit_b's real widths (embed 768, 12 heads of dim 64, 14x14
    # windows, 64x64 tokens, the same prompt encoder and mask decoder) with two blocks: block 0
    # windowed, block 1 global. Every switch's code path at a sixth of vit_b's encoder; the perf
    # layer and the parity checks keep the full-depth models.
    "vit_b_2block": ModelConfig("vit_b_2block", 768, 2, 12, (1,)),
}
MODEL_TYPES = tuple(MODEL_CONFIGS)


def model_config(model_type: str) -> ModelConfig:
    try:
        return MODEL_CONFIGS[model_type]
    except KeyError:
        choices = ", ".join(MODEL_TYPES)
        raise ValueError(f"unknown SAM 1 model type {model_type!r}; choose one of {choices}") from None
