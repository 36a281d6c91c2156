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

from tinysam.validation import HELDOUT_SEED


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
    with _renamed_into_place(path) as tmp:
        torch.save(state if wrap_key is None else {wrap_key: state}, tmp)
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


def plot_curve(path: Path, rows: list[dict], final: dict, target_miou: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    train = [r for r in rows if r.get("loss") is not None]
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="total")
    ax_loss.plot([r["step"] for r in train], [r["mask"] for r in train], label="mask (20 focal + dice)")
    ax_loss.plot([r["step"] for r in train], [r["iou"] for r in train], label="IoU head MSE")
    if any(r.get("object") is not None for r in train):
        ax_loss.plot([r["step"] for r in train], [r["object"] for r in train], label="object score BCE")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_title("training loss")
    ax_loss.legend()
    val = [r for r in rows if r.get("val_miou") is not None]
    ax_val.plot([r["step"] for r in val], [r["val_miou"] for r in val], "o-", label=f"held-out (seed {HELDOUT_SEED}), point")
    for name, marker in (("scenes_point", "s"), ("heldout_box", "^")):
        if final.get(name):
            ax_val.plot([final["step"]], [final[name]["miou"]], marker, label=f"final {name.replace('_', ', ')}")
    ax_val.axhline(target_miou, color="grey", linestyle="--", label=f"target {target_miou}")
    ax_val.set_ylim(0, 1)
    ax_val.set_xlabel("step")
    ax_val.set_title("validation mIoU (full resolution)")
    ax_val.legend(loc="lower right")
    fig.tight_layout()
    with _renamed_into_place(path, ".tmp.png") as tmp:  # the extension tells savefig the format
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
