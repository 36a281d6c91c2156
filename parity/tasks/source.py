"""Which model a task's golden and check run: the model type and its weights (a checkpoint file or
seeded synthetic weights), how to name them in a golden's folder and in a command, and how to build
a stage of it. Every task takes its model from here."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

import samfast
from parity.golden import manifest as golden_io
from samfast.build import synthetic_state_dict


@dataclass(frozen=True)
class ModelSource:
    """Which weights: a checkpoint file, or seeded synthetic weights (which make meaningless masks)."""

    model_type: str
    checkpoint: Path | None = None
    seed: int = 0

    @property
    def label(self) -> str:
        return self.checkpoint.name if self.checkpoint else f"synthetic seed {self.seed}"

    @property
    def masks_meaningful(self) -> bool:
        return self.checkpoint is not None

    @property
    def build_seed(self) -> int | None:
        """The seed to build with: none beside a checkpoint, whose weights a seed cannot pick."""
        return None if self.checkpoint else self.seed

    def sha256(self) -> str:
        if self.checkpoint:
            return golden_io.file_sha256(self.checkpoint)
        return golden_io.state_dict_sha256(synthetic_state_dict(self.model_type, self.seed))

    def dir_id(self, sha: str) -> str:
        return f"{self.checkpoint.stem}-{sha[:8]}" if self.checkpoint else f"synthetic-seed{self.seed}"

    def build(self, stages: str, device: torch.device, batch_size: int):
        return samfast.build_sam(self.model_type, self.checkpoint, seed=self.build_seed, device=device, stages=stages, batch_size=batch_size)

    def cli_args(self) -> str:
        return f"--model {self.model_type} " + (f"--checkpoint {shlex.quote(str(self.checkpoint))}" if self.checkpoint else f"--seed {self.seed}")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def release_gpu_cache() -> None:
    """Hand the memory this process freed back to the driver (before each stage of a check). The gate
    runs its checks beside four pytest workers on one GPU, and memory one process keeps cached is memory
    the others cannot allocate: an H100 gate run failed a 2 GiB allocation while three other processes
    held 68 GiB (docs/gpu-gate.md)."""
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
