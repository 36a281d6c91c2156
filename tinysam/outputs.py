"""What a training run writes to --out: the weights, the manifest, the log and the curve.

Each file is written under a temporary name and then renamed, so an interrupted run never leaves
a half-written file under the name that samfast (or a reader of the manifest) trusts.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch



@contextmanager
def _renamed_into_place(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yields the temporary path to write; renames it to `path` once the write has succeeded."""
    tmp = path.with_name(path.name + suffix)
    yield tmp
    os.replace(tmp, path)


def save_checkpoint(model, path: Path, fp32_keys: tuple[str, ...], wrap_key: str | None = None) -> str:
    """fp16 state dict (the model's own layout, a plain dict of tensors) except fp32_keys, saved as
    it is or, with wrap_key, as {wrap_key: state dict} (SAM 2's official files: {"model": ...}); its sha256."""
    state = {k: v.detach().to("cpu", torch.float32 if k in fp32_keys else torch.float16).contiguous()
             for k, v in model.state_dict().items()}
    return save_state(state if wrap_key is None else {wrap_key: state}, path)


def save_state(state: dict, path: Path) -> str:
    """torch.save of `state` to `path` under a temporary name, then renamed; its sha256."""
    with _renamed_into_place(path) as tmp:
        torch.save(state, tmp)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_json(path: Path, data: dict) -> None:
    with _renamed_into_place(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")


LOG_FIELDS = ("step", "seconds", "lr", "loss", "mask", "single", "iou", "object", "steps_per_s", "val_miou")


def write_log_csv(path: Path, rows: list[dict], fields: tuple[str, ...] = LOG_FIELDS) -> None:
    with _renamed_into_place(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot_curve(path: Path, rows: list[dict], losses: dict[str, str], validations: dict[str, str],
               titles: tuple[str, str], points: tuple[tuple[int, float, str, str], ...] = (),
               target: float | None = None) -> None:
    """The run's curve: the logged loss terms (key: label) against the step, log scale, beside the
    validation figures (key: label) in [0, 1], with single points (step, value, label, marker) and a
    target line. A loss term no row has is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    train = [r for r in rows if r.get("loss") is not None]
    for key, label in losses.items():
        if any(r.get(key) is not None for r in train):
            ax_loss.plot([r["step"] for r in train], [r[key] for r in train], label=label)
    ax_loss.set_yscale("log")
    ax_loss.set_title(titles[0])
    for (key, label), marker in zip(validations.items(), "os^v"):
        val = [r for r in rows if r.get(key) is not None]
        ax_val.plot([r["step"] for r in val], [r[key] for r in val], f"{marker}-", label=label)
    for step, value, label, marker in points:
        ax_val.plot([step], [value], marker, label=label)
    if target is not None:
        ax_val.axhline(target, color="grey", linestyle="--", label=f"target {target}")
    ax_val.set_ylim(0, 1)
    ax_val.set_title(titles[1])
    ax_val.legend(loc="lower right")
    for ax in (ax_loss, ax_val):
        ax.set_xlabel("step")
    ax_loss.legend()
    fig.tight_layout()
    with _renamed_into_place(path, ".tmp.png") as tmp:  # the extension tells savefig the format
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
