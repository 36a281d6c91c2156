"""Make the example HTML report of the docs: the embedded default with one failing stage, and its screenshot.

    python tools/report_example.py [--limit 2] [--out reports/example] [--png docs/report-html.png]

On a CPU the 2:4 sparse stage (the real failing stage of the embedded default) cannot run: its
semi-structured kernels need CUDA. The failing stage here computes what it computes, the encoder's
block linears 2:4-pruned (samfast.quantize.prune_2_4), with dense fp32 products, named so in the
report and held to fp32's thresholds (the GPU's sparse stage is held to its own). On a GPU,
render the real thing instead: `python -m parity check --stages fp32 bf16 nt bf16+compile+sdpa+triton+nt+sparse`
then `python -m parity.html_report --screenshot reports/report.html docs/report-html.png`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from parity.golden.data import load_dataset  # noqa: E402
from parity.report.html import CHROMIUM_INSTALL, find_chromium, screenshot  # noqa: E402
from parity.tasks.point.report import write_reports  # noqa: E402
from parity.tasks.point.runner import make_golden, run_check  # noqa: E402
from parity.tasks.source import ModelSource  # noqa: E402
from samfast.checkpoint import NAMED_CHECKPOINTS  # noqa: E402
from samfast.quantize import prune_2_4  # noqa: E402

STAGES = ["fp32", "fp32+sdpa", "fp32+triton", "fp32+nt"]
DEFECT_STAGE, DEFECT_LABEL = "fp32+nt", "2:4-pruned encoder (dense, CPU)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=2, help="first N generated scenes (default 2)")
    parser.add_argument("--out", type=Path, default=Path("reports/example"))
    parser.add_argument("--png", type=Path, default=Path("docs/report-html.png"))
    args = parser.parse_args(argv)
    if find_chromium() is None:  # before minutes of checking, not after
        print(f"error: the screenshot needs Chromium; install it with `{CHROMIUM_INSTALL}`", file=sys.stderr)
        return 2
    source = ModelSource("vit_tiny", NAMED_CHECKPOINTS["trained"])
    scenes = load_dataset("scenes", limit=args.limit)

    def build(stage: str):
        model = source.build(stage, torch.device("cpu"), 8)
        if stage == DEFECT_STAGE:
            for linear in model.encoder_linears().values():
                linear.weight.data = prune_2_4(linear.weight.data)
        return model

    with tempfile.TemporaryDirectory() as root:
        golden = make_golden(source, scenes, device="cpu", root=Path(root))
        results, paths = run_check(source, scenes, STAGES, data_args=f"--data scenes --limit {args.limit}",
                                   device="cpu", golden=golden, report_dir=args.out, build=build)
    for result in results:
        if result.stage == DEFECT_STAGE:
            result.stage = DEFECT_LABEL
    header = json.loads(paths["report.json"].read_text())["header"]
    header["golden"] = f"a fresh fp32 golden of the first {args.limit} scenes"
    write_reports(args.out, header, results)
    screenshot(paths["report.html"], args.png)
    print(f"wrote {paths['report.html']} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
