"""bench.video's plumbing on the CPU: sam2.1_hiera_nano at input size 256, a 3-frame 160x120 clip, 1 and 2
objects, samfast and sam2 in fp32 (~15 s on 2 CPU cores)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import video
from bench.timing import timed_compile_note
from samfast.stages import SWITCHES
from samfast.build_video import VIDEO_SWITCHES

pytest.importorskip("sam2", reason="the SAM 2 reference package sam2==1.1.0 is not installed")

QUICK = ["--cpu", "--models", "sam2.1_hiera_nano", "--frames", "3", "--warmup-frames", "1", "--input-size", "256",
         "--height", "120", "--width", "160"]


# A switch video tracking is not built for yet, whichever that is when the test runs
UNBUILT = next(switch for switch in SWITCHES if switch != "fp32" and switch not in VIDEO_SWITCHES)


def run_bench(out, argv: list[str]) -> tuple[dict, str]:
    # One thread: this checks plumbing, not speed, and two OpenMP threads on two shared cores (another
    # test process beside this one) stall for seconds a step (measured: 75 s instead of 15 s for this run).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert video.main([*argv, "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    return json.loads((out / "video.json").read_text()), (out / "video.md").read_text()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return run_bench(tmp_path_factory.mktemp("bench-video"), [*QUICK, "--objects", "1", "2", "--stages", "fp32", UNBUILT,
                                                                  "--reference", "fp32", "bf16"])


def test_several_videos_go_through_one_call_for_samfast_and_one_after_another_for_sam2(tmp_path, monkeypatch):
    """Two videos, samfast's frames encoded two a call (--frames-per-encode) and the compile mode asked for,
    both said in the header."""
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")  # restored after the test: --compile-mode sets it
    results, table = run_bench(tmp_path, [*QUICK, "--objects", "1", "--videos", "2", "--stages", "fp32", "--reference", "fp32",
                                          "--frames-per-encode", "2", "--compile-mode", "reduce-overhead"])
    assert results["environment"]["frames_per_encode"] == 2 and "takes 2 frame(s) about to be tracked per call" in table
    assert results["environment"]["compile_mode"] == "reduce-overhead" and "the compile switch's mode reduce-overhead" in table
    rows = {r["impl"]: r for r in results["results"]}
    assert rows["samfast"]["notes"]["videos_together"] is True and len(rows["samfast"]["notes"]["per_run_fps"]) == 1
    assert rows["sam2"]["notes"]["videos_together"] is False and len(rows["sam2"]["notes"]["per_run_fps"]) == 2
    assert all(r["fps"] > 0 and r["compile_s"] is not None for r in rows.values())


def test_every_row_and_object_count_is_reported(report):
    results, _ = report
    assert [(r["impl"], r["stage"], r["objects"]) for r in results["results"]] == [
        (impl, stage, objects) for impl, stage in (("sam2", "fp32"), ("sam2", "bf16"), ("samfast", "fp32"), ("samfast", UNBUILT))
        for objects in (1, 2)]


def test_measured_rows_have_positive_numbers(report):
    results, table = report
    measured = [r for r in results["results"] if r["stage"] == "fp32"]
    for r in measured:
        assert r["error"] is None and r["skipped"] is None, r
        assert r["fps"] > 0 and r["first_frame_ms"] > 0 and r["build_s"] > 0 and r["compile_s"] is not None, r
        assert r["peak_gib"] is None  # no CUDA: '-' in the table
        assert len(r["notes"]["per_run_fps"]) == 1 and r["notes"]["videos_together"] is False
    assert "| sam2.1_hiera_nano | 2 | samfast | fp32 |" in table and "| sam2.1_hiera_nano | 1 | sam2 | fp32 |" in table
    samfast_two = next(line for line in table.splitlines() if line.startswith("| sam2.1_hiera_nano | 2 | samfast | fp32 |"))
    assert "x fp32 |" in samfast_two  # its fps beside sam2's fp32 row of the same object count


def test_an_unbuilt_stage_is_refused_and_a_cpu_skips_sam2s_bf16(report):
    results, table = report
    by_key = {(r["impl"], r["stage"], r["objects"]): r for r in results["results"]}
    for objects in (1, 2):
        refused = by_key["samfast", UNBUILT, objects]
        assert refused["fps"] is None and refused["error"] is None
        assert refused["skipped"].startswith(f"refused: stages={UNBUILT!r}") and "not built for video tracking" in refused["skipped"]
        assert by_key["sam2", "bf16", objects]["skipped"].endswith("GPU only")
    assert f"refused: stages={UNBUILT!r}" in table


def test_the_header_names_device_weights_command_and_prompts(report):
    results, table = report
    env = results["environment"]
    assert env["device"].startswith("CPU") and env["commit"] and "--objects 1 2" in env["command"]
    assert "seeded synthetic weights" in table and "commit" in table
    assert "2 object(s) prompted: objects 1-2: the clip's generated objects" in table


def test_objects_beyond_the_generated_ones_are_clicked_at_distinct_grid_points(tmp_path):
    clip = video.make_clip(tmp_path, frames=2, height=120, width=160, max_objects=8)
    assert len(clip.clicks) == 8 and len(set(clip.clicks)) == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000.jpg", "00001.jpg"]
    assert "objects 4-8: one click each at points of a grid" in clip.describe(8)


def test_a_stage_keeps_the_spelling_given_and_one_row_per_switch_set():
    """The ladder's short name for bf16+compile+sdpa is "sdpa": a table row labelled so would read as
    fp32+sdpa (an H200 run printed it), so rows keep the spelling given; two spellings of one switch
    set are one row."""
    args = video.parse_args(["--stages", "bf16+compile+sdpa", "sdpa+fp32", "fp32+sdpa", "bf16+sdpa"])
    assert args.stages == ["bf16+compile+sdpa", "sdpa+fp32", "bf16+sdpa"]


class GrowingStepTracker:
    """A stand-in predictor whose compiled tracking step sees a new input shape every `grow_every` frames
    (None: never): with the warm-up's one tracked frame, the timed session's later frames recompile."""

    def __init__(self, grow_every: int | None) -> None:
        self.grow_every = grow_every
        self.step = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)

    def init_state(self, folder):
        return {"frames": 6}

    def add_new_points_or_box(self, state, frame_idx, obj_id, points, labels):
        pass

    def propagate_in_video(self, state, start_frame_idx, max_frame_num_to_track=None):
        frames = state["frames"] if max_frame_num_to_track is None else max_frame_num_to_track + 1
        for t in range(frames):
            size = 1 if self.grow_every is None else 1 + t // self.grow_every
            yield t, [1], self.step(torch.zeros(size))


@pytest.mark.parametrize("grow_every", [None, 2])
def test_a_row_that_compiled_while_timed_says_so(tmp_path, grow_every):
    """Planted defect: a recompile after the warm-up (c43208b's H100 run: a tracker recompiled mid-video
    and its row read 6.5 fps, compile time, with nothing in the table saying so). The row counts the
    graphs compiled while timed and its note says it; a steady tracker's row has no note."""
    torch._dynamo.reset()
    clip = video.BenchClip(folder=tmp_path, clicks=[(1.0, 1.0)], size=(4, 4), frames=6, generated_objects=1)
    row = video.Row("stand-in", video.SAMFAST, "fp32+compile", objects=1, videos=1)
    video.measure(row, GrowingStepTracker(grow_every), clip, torch.device("cpu"), warmup_frames=1)
    torch._dynamo.reset()
    if grow_every is None:
        assert row.notes["compiled_while_timed"] == 0 and timed_compile_note(row.notes) == ""
    else:  # frames 0-1 warmed up one shape; the timed frames 2-3 and 4-5 bring two more
        assert row.notes["compiled_while_timed"] == 2
        assert "2 graph(s) compiled while timed" in timed_compile_note(row.notes)


def test_profile_parts_are_ranged_while_profiling_and_restored_after():
    from torch.profiler import ProfilerActivity, profile

    from bench.video_profile import PARTS, part_ranges

    class Steps:
        def __getattr__(self, name):  # every part's method: doubles its argument
            if name.startswith("__"):
                raise AttributeError(name)
            return lambda x: 2 * x

    predictor = Steps()
    predictor.model = Steps()
    with part_ranges(predictor, PARTS), profile(activities=[ProfilerActivity.CPU]) as prof:
        results = [getattr(getattr(predictor, owner) if owner else predictor, method)(torch.ones(1))
                   for _, owner, method in PARTS]
    assert all(torch.equal(r, torch.full((1,), 2.0)) for r in results)
    assert {part for part, _, _ in PARTS} <= {event.key for event in prof.key_averages()}
    assert not vars(predictor.model) and set(vars(predictor)) == {"model"}  # the wrappers are gone


@pytest.mark.parametrize("clicks", [False, True])
def test_the_profile_tables_name_every_part_on_the_cpu(tmp_path, clicks):
    """bench.video_profile end to end at the smallest size: the tracked frames, or the frame-0 clicks."""
    from bench import video_profile
    from bench.video_profile import CLICK_PARTS, PARTS

    argv = ["--model", "sam2.1_hiera_nano", "--stage", "fp32", "--objects", "1", "2", "--frames", "2",
            "--warmup-frames", "1", "--frames-per-encode", "1", "--input-size", "256", "--out", str(tmp_path)]
    assert video_profile.main(argv + (["--clicks"] if clicks else [])) == 0
    text = (tmp_path / "video-profile.md").read_text()
    unit = "click" if clicks else "frame"
    assert f"| what | 1 obj us/{unit} | 2 obj us/{unit} | 2 / 1 |" in text
    for part, _, _ in CLICK_PARTS if clicks else PARTS:
        row = next(line for line in text.splitlines() if line.startswith(f"| {part} |"))
        assert float(row.split("|")[2]) > 0  # the part ran and was timed at one object
