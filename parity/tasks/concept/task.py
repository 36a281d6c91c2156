"""The concept task (SAM 3): every category name of the data set as a phrase on every image, each
(image, phrase)'s detections above the confidence threshold paired by decoder query with the fp32 golden's,
and cgF1 against the data set's ground truth beside them."""

from __future__ import annotations

import argparse

import torch

from parity.golden.data import Dataset
from parity.golden.distributed import Ranks
from parity.tasks.concept import golden as concept_golden
from parity.tasks.concept import runner
from parity.tasks.concept.embedded import EMBEDDED, EMBEDDED_GOLDEN
from parity.tasks.concept.produce import IGNORED_SWITCHES
from parity.tasks.source import ModelSource
from parity.tasks.task import EmbeddedCheck, Task

REPORT_FOLDER = "concept"


def _probability(text: str) -> float:
    """argparse type of a confidence threshold: a number in [0, 1), refused in one line otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"a detection's score is a probability: pass a number in [0, 1), got {value}")
    return value


def _add_arguments(parser: argparse.ArgumentParser) -> list[str]:
    group = parser.add_argument_group("concept segmentation (--task concept only)")
    group.add_argument("--confidence-threshold", type=_probability, metavar="P",
                       help=f"keep detections scoring above P (default {runner.DEFAULT_CONFIDENCE_THRESHOLD:g}, "
                            "Sam3Processor's; cgF1 is defined at 0.5)")
    return ["confidence_threshold"]


def _threshold(args) -> float:
    given = args.confidence_threshold
    return runner.DEFAULT_CONFIDENCE_THRESHOLD if given is None else given


def _make_golden(args, source: ModelSource, dataset: Dataset, device: torch.device, ranks: Ranks) -> str:
    folder = runner.make_golden(source, dataset, _threshold(args), device=device, root=args.golden_root)
    return f"concept golden written: {folder} ({len(dataset.samples)} images)"


def _run_check(args, source: ModelSource, dataset: Dataset, data_args: str, stages: list[str], device: torch.device,
               ranks: Ranks):
    return runner.run_check(source, dataset, stages, _threshold(args), data_args=data_args, device=device,
                            golden=args.golden, report_dir=args.report_dir / REPORT_FOLDER, require_gpu=args.require_gpu)


CONCEPT = Task(
    name="concept",
    help="concept segmentation: phrases to every instance (SAM 3; parity.tasks.concept)",
    golden_files=(concept_golden.DETECTIONS_FILE,),
    add_arguments=_add_arguments,
    make_golden=_make_golden,
    run_check=_run_check,
    planted_defects=(
        "tests/parity/test_concept_gate.py::test_perturbed_detector_fails",
        "tests/unit/test_concept_compare.py::test_a_detection_lost_far_from_the_threshold_fails",
        "tests/unit/test_concept_compare.py::test_a_new_detection_far_from_the_threshold_fails",
        "tests/unit/test_concept_compare.py::test_a_shifted_mask_fails",
        "tests/unit/test_concept_compare.py::test_a_moved_box_fails",
        "tests/unit/test_concept_compare.py::test_a_detection_moved_to_another_query_fails",
        "tests/unit/test_concept_compare.py::test_a_score_error_fails",
        "tests/unit/test_concept_compare.py::test_a_score_error_of_a_query_neither_side_kept_fails",
        "tests/unit/test_concept_compare.py::test_a_presence_error_fails",
    ),
    one_process=True,
    ignored_switches=IGNORED_SWITCHES,
    report_folder=REPORT_FOLDER,
    # without a GPU fp32 and fp32+sdpa on the reduced SAM 3 (parity.tasks.concept.embedded says why); with one
    # every default GPU stage SAM 3 builds
    embedded=(EmbeddedCheck("check-concept", "python -m parity check --task concept (SAM 3)", tuple(EMBEDDED_GOLDEN),
                            tuple(EMBEDDED), golden_on_cpu=True, report_dir="sam3"),),
)
