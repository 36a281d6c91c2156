"""Hyper-parameters of each SAM 2 model type, copied from sam2 1.1.0's yaml configs, and the
model type a state dict's shapes say it is.

sam2 builds its models from hydra configs (sam2/configs/sam2.1/*.yaml, sam2/configs/sam2/*.yaml);
samfast keeps the numbers here so that building a model needs neither yaml nor hydra nor sam2.
What every config shares (d_model 256, 7 memories, 4 memory-attention layers, ...) is a
module constant; what differs per type is the trunk and, between 2.0 and 2.1, three flags of the
object pointers and the spatial no-object embedding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

IMAGE_SIZE = 1024
BACKBONE_STRIDE = 16
D_MODEL = 256  # the neck's width, the prompt encoder's and the mask decoder's
MEM_DIM = 64  # the memory encoder's output width
NUM_MASKMEM = 7
MEMORY_ATTENTION_LAYERS = 4


@dataclass(frozen=True)
class Sam2Config:
    name: str
    embed_dim: int  # the trunk's first stage; doubled at each of the 3 pooled stages
    num_heads: int
    stages: tuple[int, ...]
    global_att_blocks: tuple[int, ...]
    window_pos_embed_bkg_spatial_size: tuple[int, int] = (14, 14)
    window_spec: tuple[int, ...] = (8, 4, 14, 7)
    # SAM 2.1 (True) / 2.0 (False): sam2.1 adds signed, projected temporal encodings to the object
    # pointers and a learned embedding for frames without the object.
    sam2_1: bool = True

    @property
    def depth(self) -> int:
        return sum(self.stages)

    @property
    def backbone_channel_list(self) -> tuple[int, ...]:
        """The trunk's stage widths, lowest resolution first (the neck's order)."""
        return tuple(self.embed_dim * 2**i for i in reversed(range(len(self.stages))))


def _both_versions(size: str, **trunk) -> dict[str, Sam2Config]:
    return {
        f"sam2.1_hiera_{size}": Sam2Config(f"sam2.1_hiera_{size}", **trunk, sam2_1=True),
        f"sam2_hiera_{size}": Sam2Config(f"sam2_hiera_{size}", **trunk, sam2_1=False),
    }


SAM2_CONFIGS: dict[str, Sam2Config] = {
    **_both_versions("t", embed_dim=96, num_heads=1, stages=(1, 2, 7, 2), global_att_blocks=(5, 7, 9),
                     window_pos_embed_bkg_spatial_size=(7, 7)),
    **_both_versions("s", embed_dim=96, num_heads=1, stages=(1, 2, 11, 2), global_att_blocks=(7, 10, 13),
                     window_pos_embed_bkg_spatial_size=(7, 7)),
    **_both_versions("b+", embed_dim=112, num_heads=2, stages=(2, 3, 16, 3), global_att_blocks=(12, 16, 20)),
    **_both_versions("l", embed_dim=144, num_heads=2, stages=(2, 6, 36, 4), global_att_blocks=(23, 33, 43),
                     window_pos_embed_bkg_spatial_size=(7, 7), window_spec=(8, 4, 16, 8)),
    # The project's own small SAM 2 (no official checkpoint): one block per Hiera stage plus a
    # global one in stage 3, the pooled stages included, at a third of hiera_t's width. The CPU
    # gate's embedded SAM 2 (trained on generated scenes as vit_tiny is) and the video work's start.
    "sam2.1_hiera_nano": Sam2Config("sam2.1_hiera_nano", embed_dim=32, num_heads=1, stages=(1, 1, 2, 1),
                                    global_att_blocks=(3,), window_pos_embed_bkg_spatial_size=(7, 7)),
    # For the correctness layers' compile and stage tests only (tests/gpu, tests/system/test_sam2_compile.py),
    # seeded weights: hiera_t's widths, windows and heads with one block per stage (the pooled stages'
    # first blocks included) plus a global one, as vit_b_2block is to vit_b. Every switch's code path
    # for a fraction of the compile time.
    "sam2.1_hiera_t_5block": Sam2Config("sam2.1_hiera_t_5block", embed_dim=96, num_heads=1, stages=(1, 1, 2, 1),
                                        global_att_blocks=(3,), window_pos_embed_bkg_spatial_size=(7, 7)),
}
SAM2_MODEL_TYPES = tuple(SAM2_CONFIGS)
# Official checkpoint names per size, for error messages that say what a file looks like
SIZE_NAMES = {"t": "tiny", "s": "small", "b+": "base_plus", "l": "large"}


def sam2_config(model_type: str) -> Sam2Config:
    try:
        return SAM2_CONFIGS[model_type]
    except KeyError:
        choices = ", ".join(SAM2_MODEL_TYPES)
        raise ValueError(f"unknown SAM 2 model type {model_type!r}; choose one of {choices}") from None


def model_type_of_config_file(config_file: str) -> str:
    """The model type of one of sam2's config names.

    Accepts what sam2's build_sam2 accepts for the image configs: "configs/sam2.1/sam2.1_hiera_t.yaml",
    "configs/sam2/sam2_hiera_t.yaml", the legacy top-level "sam2_hiera_t.yaml", and also the bare
    stem ("sam2.1_hiera_t").
    """
    stem = config_file.replace("\\", "/").rsplit("/", 1)[-1]
    stem = stem.removesuffix(".yaml")
    if stem not in SAM2_CONFIGS:
        names = ", ".join(f"configs/{'sam2.1' if c.sam2_1 else 'sam2'}/{n}.yaml" for n, c in SAM2_CONFIGS.items())
        raise ValueError(f"unknown SAM 2 config {config_file!r}; samfast knows {names}")
    return stem


TRUNK_KEY = "image_encoder.trunk.patch_embed.proj.weight"  # in every SAM 2 state dict
SAM2_1_KEY = "no_obj_embed_spatial"  # in SAM 2.1 state dicts only


def infer_sam2_model_type(state_dict: Mapping) -> tuple[str | None, int, int]:
    """(model type or None, trunk embed dim, trunk depth) read off a SAM 2 state dict."""
    embed_dim = state_dict[TRUNK_KEY].shape[0]
    depth = len({k.split(".")[3] for k in state_dict if k.startswith("image_encoder.trunk.blocks.")})
    sam2_1 = SAM2_1_KEY in state_dict
    for name, cfg in SAM2_CONFIGS.items():
        if (cfg.embed_dim, cfg.depth, cfg.sam2_1) == (embed_dim, depth, sam2_1):
            return name, embed_dim, depth
    return None, embed_dim, depth
