"""The point task: one prompt (a point or a box) per annotation, every stage's masks, scores and logits
against the fp32 golden's. It reads every switch, nt included (prompts of a batch in one decoder call)."""

from __future__ import annotations

import argparse

import torch

from parity.golden.data import Dataset
from parity.golden.distributed import Ranks
from parity.tasks.point import golden as point_golden
from parity.tasks.point.embedded import EMBEDDED, EMBEDDED_SAM2
from parity.tasks.point.runner import make_golden, run_check
from parity.tasks.source import ModelSource
from parity.tasks.task import EmbeddedCheck, Task


def _add_arguments(parser: argparse.ArgumentParser) -> list[str]:
    return []  # --prompt and --batch-size are the CLI's own: every task accepts them


def _make_golden(args, source: ModelSource, dataset: Dataset, device: torch.device, ranks: Ranks) -> str | None:
    folder = make_golden(source, dataset, prompt=args.prompt, device=device, batch_size=args.batch_size,
                         root=args.golden_root, ranks=ranks)
    return f"golden written: {folder} ({dataset.num_annotations} annotations)" if ranks.is_main else None


def _run_check(args, source: ModelSource, dataset: Dataset, data_args: str, stages: list[str], device: torch.device,
               ranks: Ranks):
    return run_check(source, dataset, stages, data_args=data_args, prompt=args.prompt, device=device,
                     batch_size=args.batch_size, golden=args.golden, report_dir=args.report_dir, ranks=ranks,
                     require_gpu=args.require_gpu)


POINT = Task(
    name="point",
    help="one prompt per annotation (default)",
    golden_files=point_golden.CONTENT_FILES,
    add_arguments=_add_arguments,
    make_golden=_make_golden,
    run_check=_run_check,
    planted_defects=(
        "tests/parity/test_gate.py::test_planted_defect_fails_and_names_worst_annotations",
        "tests/parity/test_gate.py::test_planted_defect_fails_on_synthetic_weights_through_logits",
        "tests/parity/test_not_exercised.py::test_kernel_that_fell_back_is_not_exercised_and_require_gpu_fails_it",
    ),
    embedded=(EmbeddedCheck("check", "python -m parity check", tuple(EMBEDDED)),
              EmbeddedCheck("check-sam2", "python -m parity check (SAM 2)", tuple(EMBEDDED_SAM2), report_dir="sam2")),
)
