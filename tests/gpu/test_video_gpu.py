"""Video tracking on the GPU: the CUDA stages against an fp32 golden, host-device syncs
that grow by a fixed number per tracked frame and never with the memory, and the compiled tracker over
100 frames without a recompile after its first frames.

Seeded sam2.1_hiera_nano at the video gate's 256 input (parity.tasks.video.produce), the gate's generated
clips, compile mode `default` (as the other GPU layers: max-autotune's search costs minutes and gates no
threshold), but for one test of the full stack replaying CUDA graphs (reduce-overhead). The CPU layers
hold the same predictor to sam2's (tests/unit/test_sam2_video.py), the fp32 stages to the video golden
(tests/parity/test_video_gate.py) and the compiled tracker to eager (tests/system/test_video_compile.py);
here the parts only CUDA has: bf16 on tensor cores, syncs, inductor's Triton graphs and CUDA graphs.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from parity.checks.compile import watch
from parity.checks.syncs import find_syncs, profile_region
from parity.golden.videos import generate_clip
from parity.tasks.source import ModelSource
from parity.tasks.video import runner
from parity.tasks.video.produce import DEFAULT_INPUT_SIZE, prompts
from samfast.stages import parse_stages
from samfast.build_video import VIDEO_STAGES

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
SOURCE = ModelSource("sam2.1_hiera_nano", None, 0)
SPEC = runner.VideoSpec(videos=1, frames=8)
COMPILED = "bf16+compile+sdpa"
FULL_STACK = VIDEO_STAGES[-1]  # every switch built for tracking
CUDA_STAGES = [s for s in runner.default_stages(torch.device(DEVICE)) if s != "fp32"]
EAGER_STAGES = [s for s in CUDA_STAGES if "compile" not in parse_stages(s)]
# Three xdist groups, which the gate's workers take in parallel: as one group they were one worker's 131 s,
# the longest of the warm H100 gate's GPU layer (docs/gpu-gate.md). The eager stages and the sync test
# build eager trackers; each compiled stage's tests share its graphs.
EAGER_GROUP = pytest.mark.xdist_group("video-nano-cuda eager")


def compiled_group(stage: str):
    return pytest.mark.xdist_group(f"video-nano-cuda {stage}")


STAGE_SETS = [pytest.param(EAGER_STAGES, id="eager", marks=EAGER_GROUP),
              *(pytest.param([s], id=s, marks=compiled_group(s)) for s in CUDA_STAGES if s not in EAGER_STAGES)]
FIRST_FRAMES = 2  # the prompted frame and the first tracking step: where the tracker's graphs compile
LONG_VIDEO = 100  # frames the compiled tracker runs without compiling anything after FIRST_FRAMES
# The hand-out: a tracked frame's masks may reach the host once (the caller's copy); nothing inside a
# step may wait for the GPU, and nothing may grow with the memory.
MAX_SYNCS_PER_FRAME = 1


@pytest.fixture(autouse=True)
def _default_compile_mode(monkeypatch):
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")


def predictor(stages: str):
    return runner.build_predictor(SOURCE, stages, torch.device(DEVICE), DEFAULT_INPUT_SIZE)


def clicked_state(tracker, clip, frames: int):
    """A state of the clip's first `frames` frames, each object visible on frame 0 clicked at its centre
    there: one group of objects for the whole video (an object clicked on a later frame starts a group of
    its own, a batch size of its own for the compiled graphs, and a step in the sync count)."""
    state = tracker.init_state(list(clip.frames[:frames]))
    clicks = [(obj_id, x, y) for obj_id, frame, (x, y) in prompts(clip) if frame == 0]
    assert clicks, "no object visible on the clip's first frame"
    for obj_id, x, y in clicks:
        tracker.add_new_points_or_box(state, 0, obj_id, points=np.array([[x, y]], dtype=np.float32),
                                      labels=np.array([1], dtype=np.int32))
    return state


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    return runner.make_golden(SOURCE, SPEC, device=DEVICE, root=tmp_path_factory.mktemp("golden"))


def test_the_stage_sets_are_every_cuda_stage():
    assert sorted(s for param in STAGE_SETS for s in param.values[0]) == sorted(CUDA_STAGES)
    assert COMPILED in CUDA_STAGES and len(EAGER_STAGES) < len(CUDA_STAGES)


@pytest.mark.slow(reason="each compiled stage compiles the tracker's graphs cold: 77-118 s of 84-136 s on a fresh H200")
@pytest.mark.parametrize("stages", STAGE_SETS)
def test_cuda_stages_pass_against_the_fp32_golden(stages, golden, tmp_path):
    results, _ = runner.run_check(SOURCE, SPEC, stages, device=DEVICE, golden=golden, report_dir=tmp_path,
                                  require_gpu=True)
    failed = {r.stage: r.error or r.gates for r in results if not r.passed}
    assert not failed, failed


@compiled_group("cuda graphs")
@pytest.mark.slow(reason="the whole compiled stack at max-autotune with CUDA graphs: its autotuning and graph capture")
def test_compiled_stage_replaying_cuda_graphs_passes_against_the_fp32_golden(golden, tmp_path, monkeypatch):
    """The compile switch's GPU default (max-autotune) and reduce-overhead replay CUDA graphs, whose outputs
    live in a pool the next replay may reuse: a tensor kept across graphs unread is a crash ("accessing tensor
    output of CUDAGraphs that has been overwritten", the memory attention's output before 2ac9c33 copied it)
    or masks silently overwritten. The other compiled tests run mode default, without CUDA graphs."""
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "reduce-overhead")
    results, _ = runner.run_check(SOURCE, SPEC, [FULL_STACK], device=DEVICE, golden=golden, report_dir=tmp_path,
                                  require_gpu=True)
    failed = {r.stage: r.error or r.gates for r in results if not r.passed}
    assert not failed, failed


@EAGER_GROUP
@torch.inference_mode()
def test_syncs_grow_by_a_fixed_number_per_frame_never_with_the_memory(tmp_path):
    """Syncs of a whole propagation over 4, 8 and 12 frames: the same step from 4 to 8 as from 8 to 12
    (the memory reaches its num_maskmem frames at 7, the pointers keep growing to 12: a sync per memory
    entry would show), and at most MAX_SYNCS_PER_FRAME a frame."""
    tracker, clip = predictor("bf16+sdpa"), generate_clip(1, frames=12)
    counts, where = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fill-hole warnings without sam2's CUDA extension
        for frames in (4, 8, 12):
            state = clicked_state(tracker, clip, frames)
            trace = profile_region(lambda: list(tracker.propagate_in_video(state)),
                                   trace_path=tmp_path / f"propagate-{frames}.json.gz")
            syncs = find_syncs(trace)
            counts[frames], where[frames] = len(syncs), sorted({s["python_frame"] or s["name"] for s in syncs})
    per_frame = (counts[8] - counts[4]) / 4
    assert counts[12] - counts[8] == counts[8] - counts[4], f"syncs grow with the memory: {counts}; at {where[12]}"
    assert per_frame <= MAX_SYNCS_PER_FRAME, f"{per_frame} syncs per tracked frame ({counts}), at {where[12]}"


@compiled_group(COMPILED)
@torch.inference_mode()
def test_compiled_tracker_never_recompiles_over_100_frames():
    tracker, clip = predictor(COMPILED), generate_clip(2, frames=LONG_VIDEO)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with watch() as first:
            tracked = tracker.propagate_in_video(clicked_state(tracker, clip, LONG_VIDEO), start_frame_idx=0)
            [next(tracked) for _ in range(FIRST_FRAMES)]
        with watch() as later:
            frames = sum(1 for _ in tracked)
    assert frames == LONG_VIDEO - FIRST_FRAMES
    assert first.graphs_compiled >= 4, "compile is on, yet the tracker's modules did not all compile"
    later.assert_clean()
    assert later.graphs_compiled == 0, f"{later.graphs_compiled} graph(s) compiled after frame {FIRST_FRAMES}"


@pytest.mark.parametrize("last_pointers", [4, 0])
@pytest.mark.parametrize("value_width", [256, 64])
@pytest.mark.parametrize("objects", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cross_attention_by_memory_frame_equals_one_call_on_cuda(dtype, objects, value_width, last_pointers):
    """The sdpa switch's cross-attention split by memory frame on CUDA's kernels (cuDNN in bf16, the
    memory-efficient one in fp32) against one masked F.scaled_dot_product_attention call, both against
    fp64: the memory attention's head (one of 256 channels), a memory of 3 frames of 16 x 16 tokens and 10
    pointer tokens, the last two frames and all but last_pointers pointer tokens padded for the last
    object (0: an object with no pointer yet, whose pointers' part must weigh nothing); values of 256
    channels and of the memory's 64 (the folded value projection: cuDNN refused that width for one
    object until the queries were made contiguous)."""
    from samfast.sam2.memory.attention import attention_by_memory_frame

    generator = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(objects, 1, n, width, generator=generator, device=DEVICE, dtype=torch.float64)
               for n, width in ((256, 256), (778, 256), (778, value_width)))
    mask = torch.ones(objects, 778, dtype=torch.bool, device=DEVICE)
    mask[-1, 256:768] = False
    mask[-1, 768 + last_pointers:] = False
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
    inputs = [x.to(dtype) for x in (q, k, v)]
    one_call = torch.nn.functional.scaled_dot_product_attention(*inputs, attn_mask=mask[:, None, None, :])
    q, k, v = inputs
    split = attention_by_memory_frame(q, k[:, :, :768], k[:, :, 768:], v, mask)  # 3 frames of 256, 10 pointers

    def error(out: torch.Tensor) -> float:
        return ((out.double() - exact).norm() / exact.norm()).item()

    assert split.dtype == dtype
    assert error(split) <= 1.5 * error(one_call) + 1e-6, (error(split), error(one_call))
