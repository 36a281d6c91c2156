"""The trusted slower path: segment_anything (SAM 1's reference package) and sam2 (SAM 2's) built in the
shape of a samfast model type and loaded with samfast's weights. The tests compare samfast with these, and
the benches time them beside samfast; both import them from here (bench may import parity, not tests)."""

from __future__ import annotations

import torch

from samfast.sam1.config import model_config
from samfast.sam2.config import SIZE_NAMES, sam2_config


def reference_sam(model_type: str, state_dict: dict[str, torch.Tensor]):
    """segment_anything's Sam of the same shape as samfast's `model_type`, loaded with `state_dict`."""
    from segment_anything.build_sam import _build_sam

    cfg = model_config(model_type)
    sam = _build_sam(
        encoder_embed_dim=cfg.embed_dim,
        encoder_depth=cfg.depth,
        encoder_num_heads=cfg.num_heads,
        encoder_global_attn_indexes=list(cfg.global_attn_indexes),
    )
    sam.load_state_dict(state_dict)
    return sam.eval()


# The fields of samfast's Sam2Config that sam2's configs hold under model.image_encoder.trunk
SAM2_TRUNK_FIELDS = ("embed_dim", "num_heads", "stages", "global_att_blocks", "window_pos_embed_bkg_spatial_size",
                     "window_spec")


def sam2_reference_config(model_type: str) -> tuple[str, list[str]]:
    """(sam2's config name, hydra overrides) whose build_sam2 has the shape of samfast's SAM 2 `model_type`.

    An official model type is its own config, no overrides. Another (the project's sam2.1_hiera_nano)
    is the hiera_t config of its version with every trunk number and the neck's channel list
    overridden (sam2 ships no config for it).
    """
    cfg = sam2_config(model_type)
    version = "sam2.1" if cfg.sam2_1 else "sam2"
    if model_type in {f"{version}_hiera_{size}" for size in SIZE_NAMES}:
        return f"configs/{version}/{model_type}.yaml", []

    def hydra(value) -> str:
        return f"[{','.join(map(str, value))}]" if isinstance(value, tuple) else str(value)

    overrides = [f"++model.image_encoder.trunk.{name}={hydra(getattr(cfg, name))}" for name in SAM2_TRUNK_FIELDS]
    overrides.append(f"++model.image_encoder.neck.backbone_channel_list={hydra(cfg.backbone_channel_list)}")
    return f"configs/{version}/{version}_hiera_t.yaml", overrides


def reference_sam2(model_type: str, state_dict: dict[str, torch.Tensor], device: str | torch.device = "cpu",
                   extra_overrides: list[str] | tuple[str, ...] = (), apply_postprocessing: bool = True):
    """sam2's SAM2Base (sam2.build_sam.build_sam2, as shipped) of samfast's SAM 2 `model_type` on `device`,
    loaded strictly with `state_dict`. extra_overrides: more hydra overrides, e.g.
    "++model.compile_image_encoder=True" (sam2 wraps the encoder's forward in torch.compile)."""
    from sam2.build_sam import build_sam2

    config, overrides = sam2_reference_config(model_type)
    model = build_sam2(config, None, device=device, hydra_overrides_extra=[*overrides, *extra_overrides],
                       apply_postprocessing=apply_postprocessing)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()
