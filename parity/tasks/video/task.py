"""The video task: SAM 2's tracker over generated clips (--data scenes) or DAVIS-layout folders (--data davis),
every stage's per-frame masks, logits and object scores against the fp32 golden's (J&F, drift, objects
lost). The stages of fp32, bf16, compile, sdpa and triton are built for tracking (samfast.build_video.VIDEO_STAGES;
the compiled ones run by default on a GPU only, runner.default_stages): a stage with another switch asked
for by name is refused (exit 2); left out of the default stages, it is named in the report as not built."""

from __future__ import annotations

import argparse

import torch

from parity.golden.data import Dataset
from parity.golden.distributed import Ranks
from parity.tasks.source import ModelSource
from parity.tasks.task import EmbeddedCheck, Task, positive_int
from parity.tasks.video import golden as video_golden
from parity.tasks.video import runner
from parity.tasks.video.embedded import EMBEDDED, EMBEDDED_GOLDEN
from parity.tasks.video.produce import IGNORED_SWITCHES


REPORT_FOLDER = "video"


def _add_arguments(parser: argparse.ArgumentParser) -> list[str]:
    group = parser.add_argument_group("video tracking (--task video only)")
    defaults = runner.VideoSpec()
    group.add_argument("--videos", type=positive_int, help=f"clips: generated, or the first N DAVIS videos by name (default {defaults.videos})")
    group.add_argument("--video-frames", type=positive_int, help=f"frames per clip; of a DAVIS video, its first N (default {defaults.frames})")
    group.add_argument("--video-input-size", type=positive_int, choices=(256, 1024), metavar="{256,1024}",
                       help=f"the model's input size (default {defaults.input_size}: a CPU runs it ~10x faster than 1024)")
    return ["videos", "video_frames", "video_input_size"]


def spec(args) -> runner.VideoSpec:
    given = {"videos": args.videos, "frames": args.video_frames, "input_size": args.video_input_size}
    return runner.VideoSpec(**{k: v for k, v in given.items() if v is not None}, data=str(args.data))


def _make_golden(args, source: ModelSource, dataset: Dataset | None, device: torch.device, ranks: Ranks) -> str:
    folder = runner.make_golden(source, spec(args), device=device, root=args.golden_root)
    return f"video golden written: {folder} ({spec(args).videos} clip(s))"


def _run_check(args, source: ModelSource, dataset: Dataset | None, data_args: str, stages: list[str], device: torch.device,
               ranks: Ranks):
    not_built = ()
    if args.stages is None:
        # the device's default stages that tracking has no build of are named in the report; what runs is
        # the stages built for tracking (on a GPU the defaults are ladder stages, bf16 and up, so fp32+sdpa
        # would otherwise never run there)
        not_built = tuple(s for s in stages if runner.unbuilt(s))
        stages = runner.default_stages(device)
    return runner.run_check(source, spec(args), stages, device=device, golden=args.golden,
                            report_dir=args.report_dir / REPORT_FOLDER, require_gpu=args.require_gpu, not_built=not_built)


VIDEO = Task(
    name="video",
    help="SAM 2 tracking over generated clips (--data scenes) or DAVIS folders (--data davis) (parity.tasks.video)",
    golden_files=video_golden.CONTENT_FILES,
    add_arguments=_add_arguments,
    make_golden=_make_golden,
    run_check=_run_check,
    planted_defects=(
        "tests/parity/test_video_gate.py::test_dropped_memory_fails",
        "tests/parity/test_video_gate.py::test_zeroed_object_pointers_fail",
        "tests/parity/test_video_gate.py::test_prompts_given_to_another_object_fail",
    ),
    one_process=True,
    reads_coco=False,  # VideoSpec.clips() reads --data
    ignored_switches=IGNORED_SWITCHES,
    report_folder=REPORT_FOLDER,
    embedded=(EmbeddedCheck("check-video", "python -m parity check --task video", tuple(EMBEDDED_GOLDEN), tuple(EMBEDDED),
                            golden_on_cpu=True),),
)
