"""Checkpoints in the official SAM state-dict layout: seeded synthetic ones, and loading with clear errors."""

from __future__ import annotations

import zlib
from pathlib import Path

import torch
from torch import nn

from samfast.config import MODEL_CONFIGS, ModelConfig, model_config


class CheckpointError(ValueError):
    """A checkpoint that cannot serve the requested model, with the reason and the fix."""


def synthetic_state_dict(model_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights for `model_type`, in the official layout.

    Every tensor draws from its own CPU generator seeded by (seed, key), so the result is the
    same on every machine and does not depend on key order. Scales follow common ViT inits
    (fan-in for projections, N(0, 1) for learned embeddings, small positional tables) so
    activations stay O(1) through 32 blocks; the rel-pos tables are non-zero so the decomposed
    bias really matters.
    """
    from samfast.modeling.common import LayerNorm2d
    from samfast.modeling.sam import build_sam_modules

    with torch.device("meta"):
        model = build_sam_modules(model_config(model_type))
    persistent = set(model.state_dict())
    state = {}
    for module_name, module in model.named_modules():
        for leaf, tensor in module.named_parameters(recurse=False):
            key = f"{module_name}.{leaf}"
            noise = torch.randn(tensor.shape, generator=_key_generator(seed, key))
            if isinstance(module, (nn.LayerNorm, LayerNorm2d)):
                state[key] = 1.0 + 0.02 * noise if leaf == "weight" else 0.02 * noise
            elif isinstance(module, nn.Embedding):
                state[key] = noise
            elif leaf in ("rel_pos_h", "rel_pos_w", "pos_embed"):
                state[key] = 0.05 * noise
            elif leaf == "bias":
                state[key] = 0.02 * noise
            else:  # Linear, Conv2d, ConvTranspose2d weights: keep the output variance near the input's
                in_features = tensor.shape[0] if isinstance(module, nn.ConvTranspose2d) else tensor.shape[1]
                state[key] = noise / (in_features * tensor.shape[2:].numel()) ** 0.5
        for leaf, tensor in module.named_buffers(recurse=False):
            key = f"{module_name}.{leaf}"
            if key in persistent:  # the positional Gaussian; pixel mean/std are not saved
                state[key] = torch.randn(tensor.shape, generator=_key_generator(seed, key))
    return state


def _key_generator(seed: int, key: str) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))


def infer_model_type(state_dict: dict[str, torch.Tensor]) -> tuple[str | None, int, int]:
    """(model type or None, embed dim, depth) read off a checkpoint's encoder."""
    embed_dim = state_dict["image_encoder.patch_embed.proj.weight"].shape[0]
    depth = len({k.split(".")[2] for k in state_dict if k.startswith("image_encoder.blocks.")})
    for name, cfg in MODEL_CONFIGS.items():
        if cfg.embed_dim == embed_dim and cfg.depth == depth:
            return name, embed_dim, depth
    return None, embed_dim, depth


# Checkpoints that ship inside the package: build_sam(model_type, checkpoint="trained") loads the
# model type's own trained file, which tinysam makes (python -m tinysam.train --model <type>).
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
TRAINED_CHECKPOINTS = {
    "vit_tiny": WEIGHTS_DIR / "vit_tiny_trained.pt",
    "sam2.1_hiera_nano": WEIGHTS_DIR / "sam2.1_hiera_nano_trained.pt",
}
# "trained" where no model type is given (a path for callers that hold no model): vit_tiny's, the
# gate's embedded default.
NAMED_CHECKPOINTS = {"trained": TRAINED_CHECKPOINTS["vit_tiny"]}
_FIX = (
    "Pass the path of an official sam_vit_*.pth (SAM 1) or sam2.1_hiera_*.pt (SAM 2) file, "
    "or leave checkpoint=None for seeded synthetic weights."
)


def resolve_checkpoint(checkpoint: str | Path, model_type: str | None = None) -> Path:
    """The file of a checkpoint argument (a named packaged checkpoint or a path), checked to be a
    non-empty file before anything reads or hashes it: CheckpointError otherwise. A named one is
    model_type's own ("trained": TRAINED_CHECKPOINTS[model_type]; vit_tiny's without a model type)."""
    if isinstance(checkpoint, str) and checkpoint in NAMED_CHECKPOINTS:
        path = NAMED_CHECKPOINTS[checkpoint] if model_type is None else _trained_checkpoint(model_type)
    else:
        path = Path(checkpoint)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory, not a file. {_FIX}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}. {_FIX}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): an interrupted download or copy? {_FIX}")
    return path


def _trained_checkpoint(model_type: str) -> Path:
    """The packaged trained file of model_type; CheckpointError naming the fix where none ships or
    it is missing from this install (a file tinysam has not written yet)."""
    if model_type not in TRAINED_CHECKPOINTS:
        raise CheckpointError(
            f'no trained checkpoint ships for {model_type}: checkpoint="trained" names the file tinysam trained for '
            f"{' or '.join(TRAINED_CHECKPOINTS)}. {_FIX}"
        )
    path = TRAINED_CHECKPOINTS[model_type]
    if not path.is_file():
        raise CheckpointError(
            f"the trained {model_type} checkpoint is not in this install ({path} is missing): train it with "
            f"`python -m tinysam.train --model {model_type} --out {WEIGHTS_DIR}` (a GPU run, `nox -s train-tiny -- "
            f"--model {model_type}`), or pass the path of a {model_type} checkpoint."
        )
    return path


def read_checkpoint(path: str | Path, model_type: str | None = None) -> dict[str, torch.Tensor]:
    """Load a state dict with weights_only=True, turning every failure into a message with a fix.
    model_type picks the file of a named checkpoint ("trained"; resolve_checkpoint)."""
    path = resolve_checkpoint(path, model_type)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # the weights-only unpickler raises many kinds on a damaged file
        size = path.stat().st_size
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__  # some have no message
        raise CheckpointError(
            f"{path} ({size:,} bytes) is not a readable PyTorch checkpoint: {reason}. "
            "The file is probably truncated or not a checkpoint; download it again "
            "(official sizes: vit_b 375 MB, vit_l 1.25 GB, vit_h 2.56 GB; sam2.1_hiera_tiny 156 MB to "
            "sam2.1_hiera_large 898 MB) and check its sha256."
        ) from err
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]  # training checkpoints (and every official SAM 2 file) wrap the state dict
    from samfast.sam2.config import TRUNK_KEY

    if not isinstance(state, dict) or not ({"image_encoder.patch_embed.proj.weight", TRUNK_KEY} & set(state)):
        raise CheckpointError(
            f"{path} holds no SAM state dict (neither SAM 1's 'image_encoder.patch_embed.proj.weight' key nor "
            f"SAM 2's {TRUNK_KEY!r}); pass an official sam_vit_*.pth or sam2.1_hiera_*.pt file or one saved with "
            "torch.save(model.state_dict())."
        )
    return state


def check_state_dict(state_dict: dict[str, torch.Tensor], config: ModelConfig, expected: dict[str, torch.Size]) -> None:
    """Refuse a state dict of another model type, or with missing, unexpected or misshapen keys."""
    from samfast.sam2.config import TRUNK_KEY, infer_sam2_model_type

    if TRUNK_KEY in state_dict:
        found = infer_sam2_model_type(state_dict)[0]
        fix = f"Call build_sam({found!r}, checkpoint=...) for it" if found else "It is of no SAM 2 type samfast knows"
        raise CheckpointError(
            f"this is a SAM 2 checkpoint ({found or 'unknown size'}), not a SAM 1 one; you asked for {config.name}. "
            f"{fix}, or pass a {config.name} checkpoint."
        )
    found, embed_dim, depth = infer_model_type(state_dict)
    if (embed_dim, depth) != (config.embed_dim, config.depth):
        what = found or f"an unknown model type (embed dim {embed_dim}, depth {depth})"
        what = f"{found} (embed dim {embed_dim})" if found else what
        raise CheckpointError(
            f"this checkpoint is {what}; you asked for {config.name}. "
            f"Call build_sam({(found or '<model type>')!r}, checkpoint=...) or pass a {config.name} checkpoint."
        )
    refuse_layout_mismatch(state_dict, expected, config.name)


def refuse_layout_mismatch(state_dict, expected, model_name: str) -> None:
    """Refuse (CheckpointError) a state dict whose keys or shapes differ from the model's, naming up to
    ten of each kind: the last check of every family, once the model type is known to match."""
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    misshapen = sorted(
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(expected[k])}"
        for k in set(expected) & set(state_dict)
        if state_dict[k].shape != expected[k]
    )
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")
    if unexpected:
        problems.append(
            f"unexpected keys ({len(unexpected)}): {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}"
        )
    if misshapen:
        problems.append(f"shape mismatches: {'; '.join(misshapen[:10])}")
    if problems:
        raise CheckpointError(f"checkpoint does not fit {model_name}: " + " | ".join(problems))
