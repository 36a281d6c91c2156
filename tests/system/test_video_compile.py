"""The video compile switch: the memory read at its fixed capacity, so the compiled tracker (image encoder,
decoder, memory attention, memory encoder) neither breaks the graph nor recompiles as the video grows; its
masks are the eager predictor's; and without the padding the same check fails.

Seeded sam2.1_hiera_nano at a 256 input (the video gate's model and size, parity.tasks.video.produce), the
gate's generated clip of 17 frames (parity.golden.videos), its three objects clicked on frame 0 and tracked
as one batch of three. Unpadded, the memory grows on every one of those frames: the recent memories over
the first 7, the object pointers over all 17 (the step on frame 16 is the first to read 16).

The first frames compile five graphs: the image encoder and the decoder for frame 0's clicks (one object
each), the memory encoder for the three objects' memories of frame 0 (one batch, the tracked frames' too),
then on frame 1 the memory attention and the propagation heads (prompt encoder, decoder and object
pointer of a frame without prompts, samfast.sam2.tracker.compile_propagation_heads). From frame 2 on
nothing may compile.

Runtime (2-core CPU, torch 2.14.1, seeded weights): the inductor test 199 s with a cold compile cache
(inductor's C++ compiling), 34 s warm; it runs on the GPU runners' gate (parity.gate.gpu_runner).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import samfast
from parity.checks.compile import CompileWatch, watch
from parity.golden.videos import generate_clip
from parity.tasks.video.produce import at_input_size, prompts
from samfast.video.tracker import FRAME_FEATURE_KEYS
from tests.compile_backends import aot_eager_and_inductor

pytestmark = pytest.mark.slow

NUM_FRAMES, INPUT_SIZE = 17, 256
FIRST_FRAMES = 2  # frame 0 (prompted) and frame 1 (the first tracking step): where the graphs compile
# compiled vs eager logits, both fp32: measured at most 9.4e-5 over the clip (values up to 12.3), growing
# from 8.1e-6 on frame 0: the compiled graphs and the padded memory round differently, and the bf16
# memories carry that frame to frame (no mask pixel changed side)
LOGITS_ATOL = 1e-3
OBJECT_SCORE_SHIFT = 1.0


def build(stages: str, frames_per_encode: int = 1):
    """The seeded nano at INPUT_SIZE, its object-score head's bias raised by OBJECT_SCORE_SHIFT: seeded
    weights call every object absent after the prompted frame (NO_OBJ_SCORE masks: nothing to compare),
    with the shift every object is present and every frame's logits come from the decoder."""
    predictor = samfast.build_sam_video("sam2.1_hiera_nano", device="cpu", stages=stages,
                                        frames_per_encode=frames_per_encode)
    at_input_size(predictor.model, INPUT_SIZE)
    predictor.model.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.data += OBJECT_SCORE_SHIFT
    return predictor


@pytest.fixture(scope="module")
def clip():
    return generate_clip(0, frames=NUM_FRAMES)


@torch.inference_mode()
def track(predictor, clip, frames: int) -> tuple[list[torch.Tensor], CompileWatch, CompileWatch]:
    """(every frame's video-resolution logits, what compiled in the first frames, what compiled after
    them): the clip's first `frames` frames, each object clicked at its centre on its first frame."""
    logits = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fill-hole warnings without the CUDA extension
        with watch() as first:
            state = predictor.init_state(list(clip.frames[:frames]))
            for obj_id, frame, (x, y) in prompts(clip):
                predictor.add_new_points_or_box(state, frame, obj_id, points=np.array([[x, y]], dtype=np.float32),
                                                labels=np.array([1], dtype=np.int32))
            tracked = predictor.propagate_in_video(state, start_frame_idx=0)
            logits += [next(tracked)[2].clone() for _ in range(FIRST_FRAMES)]
        with watch() as later:
            logits += [masks.clone() for _, _, masks in tracked]
    assert len(logits) == frames
    return logits, first, later


# aot_eager: the graphs, guards and recompiles are dynamo's and AOTAutograd's, and the padded memory's masks
# equal eager's in the traced graphs (64 s on 2 cores); inductor adds its C++ code to both claims (cold, 199 s
# on 2 cores: its compile of the five graphs), so the 2-core CPU run leaves it to the GPU runners
@pytest.mark.parametrize("compile_backend", aot_eager_and_inductor(
    aot_eager_slow="dynamo and AOTAutograd trace five graphs; the traced graphs and eager each track 17 frames",
    inductor_slow="inductor compiles five graphs, whose logits over 17 frames are compared with eager's",
    gpu_runner="inductor's C++ compile of the tracker's five graphs, 199 s on 2 cores cold; [aot_eager] checks "
               "the graphs and the masks in the CPU run"), indirect=True)
def test_compiled_tracking_never_recompiles_and_equals_eager(compile_backend, clip):
    # dynamo reset around the compiled predictor: graphs of the same code objects compiled before would
    # count as recompiles here
    torch._dynamo.reset()
    try:
        got, first, later = track(build("fp32+compile"), clip, NUM_FRAMES)
    finally:
        torch._dynamo.reset()
    first.assert_clean()
    assert first.graphs_compiled == 5
    later.assert_clean()
    assert later.graphs_compiled == 0

    want, _, _ = track(build("fp32"), clip, NUM_FRAMES)
    for frame, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=0, atol=LOGITS_ATOL, msg=lambda m: f"frame {frame}: {m}")
        flipped = (g > 0) != (w > 0)  # a mask pixel may change side only where the logit is ~0
        assert (w[flipped].abs() <= LOGITS_ATOL).all(), f"frame {frame}: {int(flipped.sum())} pixels flipped"


@pytest.mark.slow(reason="inductor compiles the bf16 graphs: the strides at fault were those of its output")
@pytest.mark.gpu_runner(reason="inductor's C++ compile of the bf16 tracker, 266 s on 2 cores cold; in the CPU run "
                               "test_frames_laid_out_as_inductor_did_never_recompile plants its layout, traced by dynamo")
def test_frames_encoded_in_batches_of_every_size_never_recompile(clip):
    """bf16, frames encoded five at a time: frame 0 alone (prompted), then 5, 5, 5 and the last 1. The compiled
    bf16 encoder returns its position encoding with the batch innermost, so a frame of a batch of 5 had
    strides 5x those of a frame of 1, and the memory attention (compiled, guarding on strides) recompiled
    on the video's last, shorter batch (bench.video on an H100 at c43208b, hiera_l, 48 frames, 8 a batch:
    6.5 fps, where an H200 gave 66 at 615544c; likely since deb8683 cast the encoding ahead of its batch expand).
    The predictor keeps every frame's features in one layout (samfast.video.predictor)."""
    torch._dynamo.reset()
    _, first, later = track(build("bf16+compile+sdpa", frames_per_encode=5), clip, NUM_FRAMES)
    torch._dynamo.reset()
    first.assert_clean()
    later.assert_clean()
    assert later.graphs_compiled == 0


def batch_innermost(forward_image):
    """forward_image whose features come out laid out as the compiled bf16 encoder's once did: the batch
    innermost, so a frame sliced from a batch of n has strides n times those of a frame encoded alone."""
    def forward(images):
        out = forward_image(images)
        for key in FRAME_FEATURE_KEYS:
            out[key] = [level.permute(1, 2, 3, 0).contiguous().permute(3, 0, 1, 2) for level in out[key]]
        return out
    return forward


@pytest.mark.usefixtures("dynamo_compile")
def test_frames_laid_out_as_inductor_did_never_recompile(clip):
    """The CPU run's twin of the test above: the layout inductor gave (batch_innermost) planted on the
    encoder's outputs, frames encoded three at a time (frame 0 alone, then 3, then the last 1), and the
    compiled tracker's guards (dynamo's, on strides) see every frame in one layout: nothing compiles
    after the first frames. Without the predictor's copy into one layout the last frame recompiles
    (checked by removing it)."""
    predictor = build("fp32+compile", frames_per_encode=3)
    predictor.model.forward_image = batch_innermost(predictor.model.forward_image)
    torch._dynamo.reset()
    try:
        _, first, later = track(predictor, clip, FIRST_FRAMES + 3)
    finally:
        torch._dynamo.reset()
    first.assert_clean()
    later.assert_clean()
    assert first.graphs_compiled == 5 and later.graphs_compiled == 0


@pytest.mark.usefixtures("dynamo_compile")
def test_unpadded_memory_recompiles_and_the_check_says_so(clip):
    """Planted defect: the memory as sam2 builds it (it grows by a frame and a pointer per frame here)
    reaches the compiled memory attention; watch() reports its recompiles after the first frames. One
    frame after them suffices: its memory of two frames recompiles the attention (each further frame is
    another recompile). The graphs are static (dynamic=False): a memory of a new size fails a guard of
    dynamo's, which dynamo alone shows (dynamo_compile), without AOTAutograd's trace or inductor's C++."""
    unpadded = build("fp32+compile")
    unpadded.model.fixed_capacity_memory = False
    _, _, later = track(unpadded, clip, FIRST_FRAMES + 1)
    assert any(event.reason.startswith("attend") for event in later.recompiles), later.recompiles
    with pytest.raises(AssertionError, match="recompile"):
        later.assert_clean()


def track_object_counts(counts) -> dict[int, int]:
    """Sessions of each object count in turn, on one compiled predictor (clicks at distinct points of frame 0,
    one tracked frame each): {count: graphs compiled for it}. Call it under the aot_eager_compile or dynamo_compile
    fixture: what is under test is dynamo's graphs and limits, and inductor's C++ compiling of every graph would
    take minutes."""
    predictor, clip, compiled = build("fp32+compile"), generate_clip(0, frames=2), {}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        for count in counts:
            with watch() as session:
                state = predictor.init_state(list(clip.frames))
                for obj in range(count):
                    predictor.add_new_points_or_box(state, 0, obj + 1, points=np.array([[20.0 + 25 * obj, 40.0]], dtype=np.float32),
                                                    labels=np.array([1], dtype=np.int32))
                assert sum(1 for _ in predictor.propagate_in_video(state, start_frame_idx=0)) == 2
            compiled[count] = session.graphs_compiled
    return compiled


@pytest.mark.slow(reason="a tracking session for each of nine object counts, each traced by dynamo and AOTAutograd")
@pytest.mark.usefixtures("aot_eager_compile")
def test_object_counts_from_two_on_share_one_graph(monkeypatch):
    """The memory encoder and attention compile a static graph for one object and one for every larger
    count (samfast.sam2.memory.static_graphs): counts 1..9 in one process, nothing compiles after count 2.
    Under dynamo's default recompile_limit (8): a graph per count crashed the ninth
    (docs/history/sam2-video-speed.md)."""
    # dynamo's default, which the gate's ModelCache (parity.gate.models) raises for the whole process
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    compiled = track_object_counts(range(1, 10))
    assert compiled[1] > 0 and compiled[2] > 0, compiled
    assert {count: n for count, n in compiled.items() if count > 2 and n} == {}, f"graphs compiled per count: {compiled}"


@pytest.mark.slow(reason="a tracking session for each of three object counts, every count tracing graphs of its own")
@pytest.mark.usefixtures("dynamo_compile")
def test_without_the_dynamic_object_dimension_every_count_compiles(monkeypatch):
    """Planted defect: no count gets the dynamic graph: counts 3 and 4 compile graphs of their own, which
    the test above would report. Count 1 is left out: its static graph is not the one larger counts share;
    count 2 alone makes that one (without the defect, counts 2, 3, 4 in turn compile nothing for 3 and 4)."""
    from samfast.sam2.memory import static_graphs

    monkeypatch.setattr(static_graphs, "DYNAMIC_FROM_OBJECTS", 1000)
    compiled = track_object_counts(range(2, 5))
    assert compiled[3] > 0 and compiled[4] > 0, compiled


@pytest.mark.usefixtures("dynamo_compile")
def test_without_the_lifted_cap_shapes_past_dynamos_limit_crash(monkeypatch):
    """Planted defect: static graphs per count and the cap left at dynamo's (lowered to 2 here, for time):
    the third count fails, as the ninth did before the cap was lifted (the conditioning-frame counts still
    make graphs of their own, so the cap stays)."""
    from samfast.sam2.memory import static_graphs

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    monkeypatch.setattr(static_graphs, "GRAPHS_PER_FUNCTION", 2)
    monkeypatch.setattr(static_graphs, "DYNAMIC_FROM_OBJECTS", 1000)
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        track_object_counts(range(1, 4))
