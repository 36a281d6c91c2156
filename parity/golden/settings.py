"""Where the project finds data it must never copy into the repository."""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "SAMFAST_DATA"


class DataNotFoundError(FileNotFoundError):
    """A data folder the caller asked for is not where the settings say."""


def data_root() -> Path:
    """The folder holding named datasets (coco-mini, sam-demo), from $SAMFAST_DATA.

    Without the variable we look beside the checkout (../shared/data), where this project's
    machines keep the real images; anything else is an error naming the fix.
    """
    configured = os.environ.get(DATA_ENV)
    if configured:
        root = Path(configured).expanduser()
        if not root.is_dir():
            raise DataNotFoundError(
                f"{DATA_ENV}={configured} is not a folder. Point {DATA_ENV} at the folder that "
                "holds coco-mini/ and sam-demo/ (e.g. export SAMFAST_DATA=../shared/data)."
            )
        return root
    beside_checkout = Path(__file__).resolve().parents[3] / "shared" / "data"
    if beside_checkout.is_dir():
        return beside_checkout
    raise DataNotFoundError(
        f"no data folder: set {DATA_ENV} to the folder that holds coco-mini/ and sam-demo/ "
        "(e.g. export SAMFAST_DATA=/path/to/shared/data)."
    )


def dataset_dir(name: str) -> Path:
    """A named dataset folder under data_root(), with an error that says what is missing."""
    folder = data_root() / name
    if not folder.is_dir():
        raise DataNotFoundError(
            f"dataset {name!r} not found at {folder}. Available: "
            f"{sorted(p.name for p in data_root().iterdir() if p.is_dir())}; set {DATA_ENV} "
            "to the folder that holds it."
        )
    return folder
