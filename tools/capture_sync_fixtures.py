"""Capture the real GPU profiler traces that the sync checker's unit tests read.

Run on a CUDA machine:  python tools/capture_sync_fixtures.py [OUT_DIR]
(default OUT_DIR: tests/fixtures/traces). Writes clean.json and planted_sync.json: a small module's
forward profiled by parity.checks.syncs.profile_region, once clean and once with a planted
``.item()`` inside the forward. Each trace is shrunk to the events the checker reads (every sync,
every annotation, the aten ops and Python frames around each sync, and an even sample of the rest)
so it stays under 200 KB, and the script checks that the shrunk trace gives the same findings.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
from parity.checks.syncs import encloses, find_syncs, is_sync_call, load_trace, profile_region  # noqa: E402

MAX_BYTES = 200_000


class Tiny(nn.Module):
    def __init__(self, plant_sync: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(256)
        self.fc1 = nn.Linear(256, 1024)
        self.fc2 = nn.Linear(1024, 256)
        self.plant_sync = plant_sync

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))
        if self.plant_sync:
            scale = h.abs().amax().item()  # PLANTED SYNC: the host waits for the GPU here
            h = h / scale
        return x + h


def shrink(trace: dict, max_bytes: int = MAX_BYTES) -> dict:
    """Keep what find_syncs reads (syncs, annotations, frames and ops around syncs) plus a sample."""
    events = trace["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    syncs = [e for e in spans if is_sync_call(e)]
    needed = {id(e) for e in events if e.get("ph") == "M" or e.get("cat") == "user_annotation"}
    needed |= {id(e) for e in syncs}
    needed |= {
        id(e)
        for e in spans
        if e.get("cat") in ("cpu_op", "python_function") and any(encloses(e, s) for s in syncs)
    }
    rest = [e for e in spans if id(e) not in needed]
    header = {k: v for k, v in trace.items() if k != "traceEvents"}
    for sample in (400, 200, 100, 50, 0):
        step = max(1, len(rest) // sample) if sample else len(rest) + 1
        picked = needed | {id(e) for e in rest[::step][:sample]}
        small = dict(header, traceEvents=[e for e in events if id(e) in picked])
        if len(json.dumps(small)) < max_bytes:
            return small
    raise SystemExit(f"even the needed events alone exceed {max_bytes} bytes")


def dumps(trace: dict) -> str:
    """One event a line: small diffs when a fixture is re-captured."""
    head = json.dumps({k: v for k, v in trace.items() if k != "traceEvents"})[1:-1]
    events = ",\n".join(json.dumps(e) for e in trace["traceEvents"])
    return f'{{{head},\n"traceEvents": [\n{events}\n]}}\n'


def capture(out_dir: Path, full_dir: Path | None = None) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: the fixtures are real GPU traces")
    torch.manual_seed(0)
    x = torch.randn(8, 64, 256, device="cuda")
    about = {
        "synthetic": False,
        "captured_by": "tools/capture_sync_fixtures.py",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, plant in (("clean", False), ("planted_sync", True)):
        model = Tiny(plant).cuda().eval()

        def forward() -> None:
            with torch.no_grad():
                model(x)

        with tempfile.TemporaryDirectory() as tmp:
            full = load_trace(profile_region(forward, trace_path=Path(tmp) / f"{name}.json"))
        small = shrink(full)
        small["parityFixture"] = dict(about, what=f"Tiny forward, {'planted .item()' if plant else 'clean'}")
        small["traceName"] = f"{name}.json"
        found_full, found_small = find_syncs(full), find_syncs(small)
        if found_full != found_small:
            raise SystemExit(f"shrinking changed the findings:\n{found_full}\n{found_small}")
        if bool(found_small) != plant:
            raise SystemExit(f"{name}: expected {'a sync' if plant else 'no sync'}, found {found_small}")
        path = out_dir / f"{name}.json"
        path.write_text(dumps(small))
        if full_dir:
            full_dir.mkdir(parents=True, exist_ok=True)
            with gzip.open(full_dir / f"{name}.full.json.gz", "wt") as f:
                json.dump(full, f)
        print(f"{path}: {len(full['traceEvents'])} -> {len(small['traceEvents'])} events, "
              f"{path.stat().st_size / 1e3:.0f} KB, syncs: {found_small}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=Path(__file__).resolve().parents[1] / "tests/fixtures/traces")
    parser.add_argument("--full-traces", type=Path, help="also write the unshrunk traces (.json.gz) here")
    args = parser.parse_args()
    capture(args.out_dir, args.full_traces)
