"""The environment for a test's `python -m ...` child process: this checkout first on PYTHONPATH.

The checkout is prepended, never substituted: a runner that provides packages through PYTHONPATH
(a GPU image with wheels unpacked into a folder) must still find them in the child.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *([inherited] if inherited else [])]), **extra}
