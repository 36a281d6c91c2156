"""The tracked tree stays small enough to travel to a GPU machine.

A GPU call carries the working tree's tracked files plus .device (the wheels and data a bare GPU
machine needs, about 9.1 MB, and 2.9 MB more with SAM 3's reference: ../shared/hooks/device-prep.sh
--sam3) and refuses more than 64 MiB (67,108,864 bytes) in all. BUDGET leaves room for both and
for growth. Only tracked files count, as `git ls-files` lists them: a fresh clone's untracked build
outputs (reports/, caches, .device itself) never travel as part of the tree and never fail this test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUDGET = 50_000_000  # bytes, as `git ls-files -z | xargs -0 du -cb | tail -1` counts them
LARGEST_SHOWN = 5
MEASURE = "git ls-files -z | xargs -0 du -cb | tail -1"


def tracked_sizes(root: Path) -> dict[str, int]:
    """Bytes of each tracked file in the working tree (a tracked file deleted there travels as nothing)."""
    listing = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    names = [name for name in listing.decode().split("\0") if name]
    return {name: os.lstat(root / name).st_size for name in names if os.path.lexists(root / name)}


def over_budget(root: Path, budget: int) -> str | None:
    """What to say when the tracked tree outgrows `budget`, or None when it fits."""
    sizes = tracked_sizes(root)
    total = sum(sizes.values())
    if total <= budget:
        return None
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:LARGEST_SHOWN]
    shown = "\n".join(f"  {size:>12,}  {name}" for name, size in largest)
    return (f"the tracked tree is {total:,} bytes, over its budget of {budget:,}. Every GPU call carries the "
            f"tracked files plus .device (wheels and data, ~9.1 MB; ~12 MB with SAM 3's reference) and refuses "
            f"more than 67,108,864 bytes in all. Measure with `{MEASURE}`. The largest tracked files:\n{shown}\n"
            "Store goldens at the precision their check needs and keep generated outputs untracked.")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True)


def _in_git_checkout(root: Path) -> bool:
    if shutil.which("git") is None:
        return False
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True).returncode == 0


def test_tracked_tree_fits_its_budget():
    if not _in_git_checkout(REPO):
        pytest.skip(f"{REPO} is not a git checkout (or git is missing): no tracked tree to measure")
    problem = over_budget(REPO, BUDGET)
    assert problem is None, problem


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to make a repository")
def test_a_tree_over_budget_fails_and_untracked_files_do_not_count(tmp_path):
    """Planted: a tracked file over a small budget fails, naming the file; an untracked one never counts."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "golden.npz").write_bytes(b"x" * 3000)
    (tmp_path / "small.txt").write_bytes(b"y" * 10)
    _git(tmp_path, "add", "golden.npz", "small.txt")
    (tmp_path / "untracked-build-output.bin").write_bytes(b"z" * 10_000)

    assert over_budget(tmp_path, 3010) is None  # exactly the two tracked files: the untracked one is not counted
    problem = over_budget(tmp_path, 3009)
    assert problem is not None and "3,010 bytes, over its budget of 3,009" in problem
    assert "golden.npz" in problem and "untracked-build-output.bin" not in problem
    assert MEASURE in problem and ".device" in problem
