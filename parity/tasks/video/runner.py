"""The gate's two jobs for video tracking: make a video golden, check stages against it.

Mirrors parity.tasks.amg.runner and shares its ModelSource. The data is generated clips
(parity.golden.videos): `--data scenes` names them, as it names the generated images for the other
tasks; or a DAVIS-layout folder (parity.golden.davis): `--data davis` is $SAMFAST_DATA/davis, as
`--data coco-mini` is $SAMFAST_DATA/coco-mini, and any other value is the folder's path. Models run at
VideoSpec.input_size (256 by default, parity.tasks.video.produce.at_input_size).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import torch

import samfast
from parity.compare.gates import StageResult
from parity.golden import manifest as golden_io
from parity.golden.davis import DAVIS_NAME, DAVIS_READER, davis_folder, read_davis
from parity.golden.settings import DATA_ENV
from parity.golden.videos import VIDEOS_VERSION, Clip, clip_fingerprint, generate_clips
from parity.tasks import check
from parity.tasks.check import GoldenRef, TaskCheck
from parity.tasks.source import ModelSource, default_device
from parity.tasks.video import compare, report
from parity.tasks.video import golden as video_golden
from parity.tasks.video.pictures import worst_frame_picture
from parity.tasks.video.produce import IGNORED_SWITCHES, PROMPT_POLICY, ClipOutputs, at_input_size, track_all
from samfast import InputError, StageError
from samfast.build_video import VIDEO_STAGES, VIDEO_SWITCHES
from samfast.stages import SWITCHES, parse_stages


@dataclass(frozen=True)
class VideoSpec:
    """Which clips and at what input size: recorded in the golden, a golden of another spec is refused.
    For DAVIS folders, videos and frames are the first N videos by name and the first N frames of each."""

    videos: int = 1
    frames: int = 6  # 3 objects x 6 frames = 18 tracking steps, ~20-40 s a stage on 2 shared CPU cores
    input_size: int = 256
    data: str = "scenes"

    @property
    def generated(self) -> bool:
        return self.data == "scenes"

    def clips(self) -> list[Clip]:
        if self.generated:
            return generate_clips(self.videos, seed=0, frames=self.frames)
        folder = davis_folder(self.data)  # "davis" missing under the data folder: DataNotFoundError saying where
        if not folder.is_dir():
            raise InputError(f"--task video runs on generated clips (--data scenes) or a DAVIS-layout folder "
                             f"(--data {DAVIS_NAME} for {DATA_ENV}/{DAVIS_NAME}, or the folder's path); "
                             f"--data {self.data!r} is neither")
        return read_davis(folder, videos=self.videos, max_frames=self.frames)

    @property
    def name(self) -> str:
        counts = f"videos{self.videos}x{self.frames}"
        return counts if self.generated else f"{Path(self.data).name}-{counts}"

    def manifest(self) -> dict:
        """What the golden records of its data (its identity is the clips' fingerprint, beside it)."""
        origin = ({"generator": VIDEOS_VERSION} if self.generated
                  else {"reader": DAVIS_READER, "folder": str(davis_folder(self.data))})
        return {"dataset": self.name, **origin, **asdict(self)}

    def description(self, clips: list[Clip]) -> str:
        if self.generated:
            return f"{self.name} ({self.videos} generated clip(s) of {self.frames} frames)"
        return f"{self.name} (DAVIS videos {', '.join(c.name for c in clips)}; at most {self.frames} frames each)"

    def cli_args(self) -> str:
        return (f"--data {shlex.quote(self.data)} --videos {self.videos} --video-frames {self.frames} "
                f"--video-input-size {self.input_size}")


def golden_folder(source: ModelSource, sha: str, spec: VideoSpec, root: Path | None = None) -> Path:
    marker = f"{video_golden.MARKER}{spec.input_size}"
    return (root or golden_io.GOLDEN_ROOT) / golden_io.golden_dir_name(source.model_type, source.dir_id(sha), spec.name, None, marker)


def regenerate_command(source: ModelSource, spec: VideoSpec) -> str:
    return f"python -m parity golden --task video {source.cli_args()} {spec.cli_args()}"


def build_predictor(source: ModelSource, stages: str, device: torch.device, input_size: int):
    predictor = samfast.build_sam_video(source.model_type, source.checkpoint, seed=source.build_seed, device=device,
                                        stages=stages)
    at_input_size(predictor.model, input_size)
    return predictor


def default_stages(device: torch.device) -> list[str]:
    """The stages a check runs unless told: VIDEO_STAGES, less the compiled ones on a CPU (inductor's C++
    compile of the tracker costs about 100 s a stage there cold, tests/system/test_video_compile.py)."""
    return [stage for stage in VIDEO_STAGES if device.type == "cuda" or "compile" not in parse_stages(stage)]


def unbuilt(stage: str) -> list[str]:
    """The stage's switches that video tracking is not built for (samfast/build_video.py)."""
    return sorted(parse_stages(stage) - VIDEO_SWITCHES, key=SWITCHES.index)


def refuse_unbuilt(stages: list[str]) -> None:
    """Stages asked for by name that build_sam_video refuses: bad input (exit 2), before any work."""
    refused = {stage: unbuilt(stage) for stage in stages if unbuilt(stage)}
    if refused:
        listed = "; ".join(f"{stage} ({', '.join(switches)})" for stage, switches in refused.items())
        raise StageError(f"--task video: stages not built for video tracking yet: {listed}; "
                         f"the video task runs {', '.join(VIDEO_STAGES)}")


def make_golden(source: ModelSource, spec: VideoSpec, *, device=None, root: Path | None = None,
                build: Callable[[str], object] | None = None) -> Path:
    device = torch.device(device) if device else default_device()
    with golden_io.fp32_settings() as settings:
        sha = source.sha256()
        clips = spec.clips()
        outputs = track_all(lambda: build("fp32") if build else build_predictor(source, "fp32", device, spec.input_size), clips)
        if not any(o.masks.any() for o in outputs):
            raise golden_io.UselessGolden("the fp32 tracker found no object on any frame: a golden of it would check nothing")
        manifest = {
            "model_type": source.model_type, "checkpoint": source.label, "checkpoint_sha256": sha,
            "dataset": spec.manifest(),
            "dataset_fingerprint": clip_fingerprint(clips), "prompt_policy": PROMPT_POLICY, "input_size": spec.input_size,
            "samfast_version": samfast.__version__, "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
            "device": golden_io.device_description(device), "fp32_settings": settings,
            "masks_meaningful": source.masks_meaningful,
        }
        return video_golden.publish(golden_folder(source, sha, spec, root), outputs, manifest)


@dataclass
class VideoCheck(TaskCheck):
    """The video task's part of the check loop (parity.tasks.check): the tracker over every clip, its
    masks, logits and object scores against the golden's."""

    source: ModelSource
    spec: VideoSpec
    device: torch.device
    golden: Path | None
    custom_build: Callable[[str], object] | None
    not_built: tuple[str, ...]

    thresholds_table = "video"
    ignored_switches = IGNORED_SWITCHES

    @cached_property
    def clips(self) -> list[Clip]:
        return self.spec.clips()

    def refuse_stages(self, stages: list[str]) -> None:
        refuse_unbuilt(stages)

    def locate_golden(self) -> GoldenRef:
        sha = self.source.sha256()
        folder = Path(self.golden) if self.golden else golden_folder(self.source, sha, self.spec)
        expected = {"model_type": self.source.model_type, "checkpoint_sha256": sha,
                    "dataset_fingerprint": clip_fingerprint(self.clips), "prompt_policy": PROMPT_POLICY}
        return GoldenRef(folder, regenerate_command(self.source, self.spec), expected)

    def read_golden(self, folder: Path, regenerate: str) -> tuple[dict, list[ClipOutputs]]:
        return video_golden.read(folder, regenerate)

    def verify_golden(self, manifest: dict, ref: GoldenRef) -> None:
        if manifest.get("input_size") != self.spec.input_size:
            raise golden_io.GoldenMismatch(
                f"golden {ref.folder} was made at input size {manifest.get('input_size')!r}, this run uses "
                f"{self.spec.input_size}: comparing them would measure the input size, not the model. Regenerate "
                f"the golden with:\n  {ref.regenerate}")

    def build(self, stage: str):
        if self.custom_build:
            return self.custom_build(stage)
        return build_predictor(self.source, stage, self.device, self.spec.input_size)

    def model_of(self, predictor) -> torch.nn.Module:
        return predictor.model

    def produce(self, predictor, stage: str, limits: dict) -> list[ClipOutputs]:
        return track_all(lambda: predictor, self.clips)

    def compare(self, stage: str, outputs: list[ClipOutputs], golden: list[ClipOutputs], limits: dict) -> StageResult:
        return compare.compare(stage, outputs, golden, self.clips, limits, self.source.masks_meaningful)

    def pictures(self, result: StageResult, outputs: list[ClipOutputs], golden: list[ClipOutputs]) -> dict[int, bytes]:
        return worst_frame_picture(result, self.clips)

    def header(self, ref: GoldenRef, manifest: dict) -> dict:
        return {
            "model_type": self.source.model_type,
            "checkpoint": self.source.label,
            "dataset": self.spec.description(self.clips),
            "input_size": self.spec.input_size,
            "prompt_policy": PROMPT_POLICY,
            **golden_io.provenance(ref.folder, manifest, self.device),
            "masks_meaningful": self.source.masks_meaningful,
            "not_built": list(self.not_built),
        }

    def write_reports(self, folder: Path, header: dict, results: list[StageResult]) -> dict[str, Path]:
        return report.write_reports(folder, header, results)


def run_check(
    source: ModelSource,
    spec: VideoSpec,
    stages: list[str],
    *,
    device=None,
    golden: Path | None = None,
    report_dir: Path = Path("reports/video"),
    build: Callable[[str], object] | None = None,
    require_gpu: bool = False,
    not_built: tuple[str, ...] = (),
) -> tuple[list[StageResult], dict[str, Path]]:
    """Check each stage's tracks against the video golden (parity.tasks.check.run_check); write
    report.md/json, junit.xml and a plot. `build(stage)` replaces the predictor (tests plant defects
    through it); `not_built` names default stages left out because video tracking has no build of them
    yet (said in the report)."""
    device = torch.device(device) if device else default_device()
    task = VideoCheck(source, spec, device, golden, build, not_built)
    return check.run_check(task, stages, report_dir=report_dir, require_gpu=require_gpu)
