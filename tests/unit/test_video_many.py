"""VideoPredictor.propagate_in_videos: several videos tracked in one call, each video's outputs those of
propagating it alone (sam2 issue #399).

Seeded sam2.1_hiera_nano at a 256 input (the video gate's model and size), built as
tests/system/test_video_compile.py builds it (the object-score head raised so that every frame's logits
come from the decoder: with seeded weights every object is otherwise absent after its prompted frame,
nothing to compare); generated clips (parity.golden.videos), each object clicked on its first visible frame
(the gate's prompts), videos with different object counts.

Alone, a video's objects prompted together take one step per frame; together, the objects of every
video on the same frame with the same memory selection take one. The batch changes only the rounding,
so each video's yielded logits and every object's bank are compared within BATCHED_TOLERANCE
(tests/unit/test_sam2_video.py), and the steps taken are checked, so that a silent fall-back to one
step per video fails. Measured (2-core CPU, torch 2.14.1, seeded weights): the logits, low-res masks,
pointers and memories bit-equal to each video tracked alone, the object scores within 1.2e-7; file
runtime 12 s on an idle CPU, about a minute on a loaded one.
"""

from __future__ import annotations

import pytest
import torch

from parity.golden.videos import generate_clip
from parity.tasks.video.produce import prompts
from tests.system.test_video_compile import build
from tests.unit.test_sam2_video import BATCHED_TOLERANCE, record_batched_steps

pytestmark = pytest.mark.filterwarnings("ignore:fill_hole_area")  # the builder's 8: warned and skipped
OBJECT_KEYS = ("pred_masks", "obj_ptr", "object_score_logits", "maskmem_features")


@pytest.fixture(scope="module")
def predictor():
    return build("fp32")


def prompted_states(predictor, clips, object_counts):
    """A state per clip, its first object_counts[i] objects clicked at their centres on their first visible frame."""
    states = []
    for clip, count in zip(clips, object_counts, strict=True):
        state = predictor.init_state(list(clip.frames))
        for obj_id, frame, (x, y) in prompts(clip)[:count]:
            predictor.add_new_points_or_box(state, frame, obj_id, points=[[x, y]], labels=[1])
        states.append(state)
    return states


def propagate(predictor, states, propagations, together: bool) -> dict[tuple[int, int], list[tuple]]:
    """{(propagation, video): [(frame_idx, obj_ids, video_res_masks)]}: each propagation
    (propagate_in_video's keyword arguments) over every video, in one call or one call per video."""
    outputs = {}
    for p, kwargs in enumerate(propagations):
        if together:
            for video, *out in predictor.propagate_in_videos(states, **kwargs):
                outputs.setdefault((p, video), []).append(tuple(out))
        else:
            for video, state in enumerate(states):
                outputs[(p, video)] = list(predictor.propagate_in_video(state, **kwargs))
    return outputs


def alone_and_together(predictor, clips, object_counts, propagations, monkeypatch):
    """(alone: (states, outputs), together: (states, outputs), the tracking steps taken together)."""
    alone_states = prompted_states(predictor, clips, object_counts)
    alone = alone_states, propagate(predictor, alone_states, propagations, together=False)
    states = prompted_states(predictor, clips, object_counts)
    steps = record_batched_steps(predictor.model, monkeypatch)
    together = states, propagate(predictor, states, propagations, together=True)
    return alone, together, steps


def assert_same_tracks(together, alone) -> None:
    """Each video's yields and every object's bank equal within BATCHED_TOLERANCE."""
    (states, outputs), (alone_states, alone_outputs) = together, alone

    def close(key, got, want, msg):
        atol, rtol = BATCHED_TOLERANCE[key]
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda detail: f"{key} {msg}: {detail}")

    assert outputs.keys() == alone_outputs.keys()
    for run_video, frames in outputs.items():
        want = alone_outputs[run_video]
        assert [(f, ids) for f, ids, _ in frames] == [(f, ids) for f, ids, _ in want]
        for (frame, _, got), (_, _, expected) in zip(frames, want):
            close("logits", got, expected, f"{run_video} frame {frame}")
    for video, (state, alone_state) in enumerate(zip(states, alone_states, strict=True)):
        for obj, alone_obj in zip(state.objects, alone_state.objects, strict=True):
            assert obj.frames_tracked == alone_obj.frames_tracked
            for (is_cond, outs), (_, alone_outs) in zip(obj.memory, alone_obj.memory):
                assert sorted(outs) == sorted(alone_outs)
                for t, out in outs.items():
                    for key in OBJECT_KEYS:
                        close(key, getattr(out, key), getattr(alone_outs[t], key), f"video {video} object {obj.obj_id} frame {t}")


def test_videos_of_the_same_length_take_one_step_per_frame(predictor, monkeypatch):
    """Two 6-frame clips, three objects and two, all prompted on frame 0: forwards, then backwards from
    the last frame, every tracked frame is one step of five objects; each video's outputs are its own."""
    clips = [generate_clip(1, frames=6), generate_clip(2, frames=6)]
    propagations = [{}, {"start_frame_idx": 5, "reverse": True}]
    alone, together, steps = alone_and_together(predictor, clips, (3, 2), propagations, monkeypatch)
    # backwards from frame 5 retracks it, as sam2 does; frame 0 is prompted
    assert steps == [(t, 5, 5) for t in range(1, 6)] + [(t, 5, 5) for t in range(5, 0, -1)]
    assert list(together[1]) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # one propagation, then the next
    assert_same_tracks(together, alone)


def test_videos_of_different_lengths(predictor, monkeypatch):
    """An 18-frame clip with three objects and a 16-frame one with two: one step of five objects per frame
    while both have frames, then the longer one's three alone. Videos shorter than max_obj_ptrs_in_encoder
    (16) frames and of different lengths share no step: the pointers' temporal encoding is normalized by
    the video's length there (6 and 4 frames: one step per video and frame)."""
    clips = [generate_clip(3, frames=18), generate_clip(4, frames=16)]
    alone, together, steps = alone_and_together(predictor, clips, (3, 2), [{}], monkeypatch)
    assert steps == [(t, 5, 5) for t in range(1, 16)] + [(t, 3, 3) for t in range(16, 18)]
    assert {video: len(frames) for (_, video), frames in together[1].items()} == {0: 18, 1: 16}
    assert_same_tracks(together, alone)

    short = [generate_clip(5, frames=6), generate_clip(6, frames=4)]
    alone, together, steps = alone_and_together(predictor, short, (2, 3), [{}], monkeypatch)
    assert steps == [(t, n, n) for t in range(1, 4) for n in (2, 3)] + [(t, 2, 2) for t in range(4, 6)]
    assert_same_tracks(together, alone)


def test_prompted_memories_of_the_videos_encoded_in_one_batch(predictor, monkeypatch):
    """The memories of frame 0's prompts in both videos (three objects and two): one memory encoding of
    five, the batch of the tracked frames (with compile: one graph for both)."""
    states = prompted_states(predictor, [generate_clip(1, frames=3), generate_clip(2, frames=3)], (3, 2))
    encode, batches = predictor.model._encode_new_memory, []

    def counted_encode(*args, **kwargs):
        batches.append(kwargs["current_vision_feats"][-1].size(1))
        return encode(*args, **kwargs)

    monkeypatch.setattr(predictor.model, "_encode_new_memory", counted_encode)
    tracked = predictor.propagate_in_videos(states)
    assert [next(tracked)[:2] for _ in states] == [(0, 0), (1, 0)]  # frame 0: the prompts' results
    assert batches == [5]


def test_a_state_given_twice_is_refused(predictor):
    (state,) = prompted_states(predictor, [generate_clip(1, frames=2)], (1,))
    with pytest.raises(ValueError, match="once"):
        next(predictor.propagate_in_videos([state, state]))
