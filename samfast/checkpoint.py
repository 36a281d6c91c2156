"""Checkpoints of every family: finding and reading the file with clear errors, and the checks every
family's state-dict check shares (another family's checkpoint, keys and shapes)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from pathlib import Path

import torch

from samfast.families.registry import FAMILIES, family_of, family_of_state_dict


class CheckpointError(ValueError):
    """A checkpoint that cannot serve the requested model, with the reason and the fix."""


def key_generator(seed: int, key: str) -> torch.Generator:
    """The CPU generator of one tensor of a seeded synthetic state dict: the same on every machine,
    whatever order the keys are drawn in."""
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))


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
    "Pass the path of an official sam_vit_*.pth (SAM 1), sam2.1_hiera_*.pt (SAM 2) or sam3.pt (SAM 3) file, "
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
    state = load_file(path)
    if isinstance(state, dict):
        state = unwrap_state_dict(state)
    if not isinstance(state, dict) or family_of_state_dict(state) is None:
        keys = " nor ".join(f"{family.name}'s {family.state_dict_key!r}" for family in FAMILIES)
        raise CheckpointError(
            f"{path} holds no SAM state dict (neither {keys} key); pass an official sam_vit_*.pth or "
            "sam2.1_hiera_*.pt file or one saved with torch.save(model.state_dict())."
        )
    return state


def load_file(path: Path) -> object:
    """torch.load of a checked file (resolve_checkpoint) with weights_only=True onto the CPU; CheckpointError
    naming the fix for one the unpickler cannot read."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # the weights-only unpickler raises many kinds on a damaged file
        size = path.stat().st_size
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__  # some have no message
        raise CheckpointError(
            f"{path} ({size:,} bytes) is not a readable PyTorch checkpoint: {reason}. "
            "The file is probably truncated or not a checkpoint; download it again "
            "(official sizes: vit_b 375 MB, vit_l 1.25 GB, vit_h 2.56 GB; sam2.1_hiera_tiny 156 MB to "
            "sam2.1_hiera_large 898 MB; sam3.pt 3.45 GB) and check its sha256."
        ) from err


def unwrap_state_dict(checkpoint: Mapping) -> Mapping[str, torch.Tensor]:
    """The state dict of a training checkpoint's {"model": state_dict} (every official SAM 2 file is
    one), or the state dict itself."""
    if "model" in checkpoint and isinstance(checkpoint["model"], Mapping):
        return checkpoint["model"]
    return checkpoint


def refuse_other_family(state_dict, model_type: str, want: str) -> None:
    """Refuse (CheckpointError) a state dict of another family than model_type's, naming the model type
    it is and `want`, what to pass instead: the first check of every family's state-dict check."""
    family, other = family_of(model_type), family_of_state_dict(state_dict)
    if other is None or other is family:
        return
    found = other.infer_model_type(state_dict)[0]
    fix = f"Call build_sam({found!r}, checkpoint=...) for it" if found else f"It is of no {other.name} type samfast knows"
    raise CheckpointError(
        f"this is a {other.name} checkpoint ({found or 'unknown size'}), not a {family.name} one; "
        f"you asked for {model_type}. {fix}, or {want}."
    )


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
