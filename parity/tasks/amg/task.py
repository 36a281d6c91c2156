"""The segment-everything task: the automatic mask generator's masks on every image, matched one to one
with the fp32 golden's. The generator decodes one image's grid at a time, so the nt switch (prompts of
several images in one nested decoder call) is not applicable to it."""

from __future__ import annotations

import argparse
from dataclasses import fields

import torch

from parity.golden.data import Dataset
from parity.golden.distributed import Ranks
from parity.tasks.amg import golden as amg_golden
from parity.tasks.amg import runner
from parity.tasks.amg.embedded import EMBEDDED, EMBEDDED_GOLDEN, EMBEDDED_SAM2, EMBEDDED_SAM2_GOLDEN
from parity.tasks.amg.produce import IGNORED_SWITCHES, AmgParams
from parity.tasks.source import ModelSource
from parity.tasks.task import EmbeddedCheck, Task, positive_int


REPORT_FOLDER = "amg"


def _add_arguments(parser: argparse.ArgumentParser) -> list[str]:
    group = parser.add_argument_group("segment everything (--task amg only; defaults: the reference generator's)")
    for f in fields(AmgParams):
        group.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), metavar=type(f.default).__name__.upper())
    group.add_argument("--points-per-batch", type=positive_int, help="points per decoder call (splits work; masks do not change)")
    return [f.name for f in fields(AmgParams)] + ["points_per_batch"]


def _params(args) -> AmgParams:
    return AmgParams(**{f.name: getattr(args, f.name) for f in fields(AmgParams) if getattr(args, f.name) is not None})


def _batch(args) -> dict:
    return {"points_per_batch": args.points_per_batch} if args.points_per_batch else {}


def _make_golden(args, source: ModelSource, dataset: Dataset, device: torch.device, ranks: Ranks) -> str:
    folder = runner.make_golden(source, dataset, _params(args), device=device, root=args.golden_root, **_batch(args))
    return f"AMG golden written: {folder} ({len(dataset.samples)} images)"


def _run_check(args, source: ModelSource, dataset: Dataset, data_args: str, stages: list[str], device: torch.device,
               ranks: Ranks):
    return runner.run_check(source, dataset, stages, _params(args), data_args=data_args, device=device,
                            golden=args.golden, report_dir=args.report_dir / REPORT_FOLDER, require_gpu=args.require_gpu,
                            **_batch(args))


AMG = Task(
    name="amg",
    help="segment everything (parity.tasks.amg)",
    golden_files=(amg_golden.MASKS_FILE,),
    add_arguments=_add_arguments,
    make_golden=_make_golden,
    run_check=_run_check,
    planted_defects=(
        "tests/parity/test_amg_gate.py::test_perturbed_decoder_fails",
        "tests/unit/test_amg_matching.py::test_mask_split_in_two_fails",
        "tests/unit/test_amg_matching.py::test_mask_lost_fails_through_the_union_mean",
        "tests/unit/test_amg_matching.py::test_mask_shifted_by_a_few_pixels_fails",
        "tests/unit/test_amg_matching.py::test_permuted_scores_fail_through_the_score_error",
        "tests/unit/test_amg_matching.py::test_planted_defect_a_filter_raised_beyond_the_tolerance_fails",
        "tests/unit/test_amg_matching.py::test_planted_defect_a_mask_clear_of_box_nms_still_fails",
        "tests/unit/test_amg_matching.py::test_crop_nms_decision",
        "tests/unit/test_amg_matching.py::test_crop_edge_decision",
        "tests/unit/test_amg_matching.py::test_small_region_decision",
        "tests/unit/test_amg_matching.py::test_a_mask_dropped_by_a_mask_near_a_decision",
    ),
    one_process=True,
    ignored_switches=IGNORED_SWITCHES,
    report_folder=REPORT_FOLDER,
    # without a GPU two stages (parity.tasks.amg.embedded says why); with one every default GPU stage
    embedded=(EmbeddedCheck("check-amg", "python -m parity check --task amg", tuple(EMBEDDED_GOLDEN), tuple(EMBEDDED),
                            golden_on_cpu=True),
              EmbeddedCheck("check-sam2-amg", "python -m parity check --task amg (SAM 2)", tuple(EMBEDDED_SAM2_GOLDEN),
                            tuple(EMBEDDED_SAM2), golden_on_cpu=True, report_dir="sam2")),
)
