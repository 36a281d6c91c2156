"""Draw the project's layers from its imports: one box per concern, one arrow per import between two.

    python tools/draw_layers.py --out docs/images/layers-after.png
    python tools/draw_layers.py --rev 735c8cd --out docs/images/layers-before.png   # a commit's tree

Boxes are grouped by what tests/unit/test_layers.py enforces: samfast at the bottom, parity's concerns
(PARITY_LAYERS) in rows above it, then tinysam and bench. A parity module outside every concern gets a
box of its own in one row above them, so a flat package shows as one long row. The same import reader
and the same concern rule as the layering test, so the picture and the test agree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.unit.test_layers import LAYERS, PARITY_LAYERS, imports_of, module_name, parity_layer  # noqa: E402


def concern(module: str) -> str:
    """The box a module is drawn in: parity's concern (a task's own box), or the package's name."""
    parts = module.split(".")
    if parts[0] != "parity":
        return parts[0]
    if parts[:2] == ["parity", "tasks"] and len(parts) > 3:
        return ".".join(parts[:3])
    rank = parity_layer(module)
    return module if rank is None else PARITY_LAYERS[rank]  # a module outside every concern: a box of its own


def row(box: str) -> int:
    """A box's height: packages by LAYERS, parity's concerns by PARITY_LAYERS inside parity's band, and
    parity's modules outside every concern in one row above them."""
    top = box.split(".")[0]
    if top != "parity":
        return LAYERS.index(top) * 10 + (20 if top != "samfast" else 0)
    rank = parity_layer(box)
    return 10 + (len(PARITY_LAYERS) if rank is None else rank)


def edges_of(root: Path) -> dict[tuple[str, str], int]:
    edges = defaultdict(int)
    for package in LAYERS:
        for path in (root / package).rglob("*.py"):
            source = concern(module_name(path, root))
            for _, target in imports_of(path, root):
                if target.split(".")[0] in LAYERS and concern(target) != source:
                    edges[(source, concern(target))] += 1
    return edges


def draw(edges: dict[tuple[str, str], int], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    boxes = sorted({b for edge in edges for b in edge}, key=lambda b: (row(b), b))
    rows = defaultdict(list)
    for box in boxes:
        rows[row(box)].append(box)
    place = {}
    for level, (height, members) in enumerate(sorted(rows.items())):
        shift = 0.12 * ((level % 3) - 1) if len(members) < 3 else 0.0  # a zigzag: no arrow runs through a box
        for i, box in enumerate(members):
            stagger = 0.22 * (i % 2 - 0.5) if len(members) > 12 else 0.0  # long rows: labels on two lines
            place[box] = ((i + 0.5) / len(members) + shift, level + stagger)
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.75 * len(rows)))
    for (a, b), count in edges.items():
        (xa, ya), (xb, yb) = place[a], place[b]
        upward = round(yb) > round(ya)  # the row, not the stagger of a long row's labels
        ax.annotate("", xy=(xb, yb), xytext=(xa, ya), arrowprops=dict(
            arrowstyle="->", lw=0.6 + 0.15 * min(count, 8), alpha=0.5, color="tab:red" if upward else "0.45",
            connectionstyle="arc3,rad=0.15", shrinkA=8, shrinkB=8))
    for box, (x, y) in place.items():
        ax.text(x, y, box.replace("parity.", "").replace("tasks.", "tasks/"), ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round", fc="white", ec="0.3"))
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(0, 1)
    ax.axis("off")
    ax.set_title(title + "   (an arrow: imports; grey downward, red upward)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/draw_layers.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="a commit to draw instead of the working tree")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.rev:
        draw(edges_of(REPO), "the working tree", args.out)
        return 0
    archive = subprocess.run(["git", "archive", args.rev, *LAYERS], cwd=REPO, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tree:
        tarfile.open(fileobj=BytesIO(archive)).extractall(tree, filter="data")
        draw(edges_of(Path(tree)), f"commit {args.rev}", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
