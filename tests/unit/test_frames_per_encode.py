"""VideoPredictor.frames_per_encode: while propagating, the image encoder takes the frames about to be
tracked in batches, and the tracks stay those of one frame per encoder call (docs/sam2.md: frames
encoded ahead of tracking, in batches).

Seeded sam2.1_hiera_nano at a 256 input with the object-score head raised (tests/system/test_video_compile.py
builds it: every frame's logits come from the decoder), a generated 6-frame clip, two objects clicked on
frame 0. The batched encoder changes only its rounding, so the yields are compared within the batched
tolerance (tests/unit/test_sam2_video.py); the encoder's batch sizes are recorded, so that a predictor
that silently encodes one frame a call fails.
"""

from __future__ import annotations

import pytest
import torch

from parity.golden.videos import generate_clip
from parity.tasks.video.produce import prompts
from tests.system.test_video_compile import build
from tests.unit.test_sam2_video import BATCHED_TOLERANCE

pytestmark = pytest.mark.filterwarnings("ignore:fill_hole_area")  # the builder's 8: warned and skipped
FRAMES = 6


@pytest.fixture(scope="module")
def predictor():
    return build("fp32")


@pytest.fixture(scope="module")
def clip():
    return generate_clip(1, frames=FRAMES)


def encoder_batches(predictor, monkeypatch) -> list[int]:
    """The batch size of every image-encoder call from now on."""
    forward_image, batches = predictor.model.forward_image, []

    def counted(images):
        batches.append(images.shape[0])
        return forward_image(images)

    monkeypatch.setattr(predictor.model, "forward_image", counted)
    return batches


def clicked_state(predictor, clip):
    state = predictor.init_state(list(clip.frames))
    for obj_id, frame, (x, y) in [p for p in prompts(clip) if p[1] == 0][:2]:
        predictor.add_new_points_or_box(state, frame, obj_id, points=[[x, y]], labels=[1])
    return state


@torch.inference_mode()
def tracks(predictor, clip, frames_per_encode: int, monkeypatch) -> tuple[list, list[int]]:
    """(every yield of a propagation forwards and one backwards from the last frame, the encoder's batch sizes)."""
    monkeypatch.setattr(predictor, "frames_per_encode", frames_per_encode)
    state = clicked_state(predictor, clip)
    batches = encoder_batches(predictor, monkeypatch)
    yields = list(predictor.propagate_in_video(state))
    yields += list(predictor.propagate_in_video(state, start_frame_idx=FRAMES - 1, reverse=True))
    monkeypatch.undo()
    return yields, batches


def test_frames_encoded_ahead_in_batches_track_as_one_at_a_time(predictor, clip, monkeypatch):
    one, one_batches = tracks(predictor, clip, 1, monkeypatch)
    ahead, ahead_batches = tracks(predictor, clip, 4, monkeypatch)
    assert one_batches == [1] * (FRAMES - 1) + [1] * (FRAMES - 2)  # frame 0 is prompted; the last is cached
    # forwards: frames 1-4, then 5; backwards: 5 is still cached, then 4-1 (0 is prompted)
    assert ahead_batches == [4, 1, 4]
    assert [(f, ids) for f, ids, _ in ahead] == [(f, ids) for f, ids, _ in one]
    atol, rtol = BATCHED_TOLERANCE["logits"]
    for (frame, _, got), (_, _, want) in zip(ahead, one):
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda detail: f"frame {frame}: {detail}")


@torch.inference_mode()
def test_a_propagation_stopped_early_leaves_prompts_encoding_their_own_frame(predictor, clip, monkeypatch):
    """The frames ahead belong to the propagation: stopped, a click on a later frame encodes that frame only."""
    monkeypatch.setattr(predictor, "frames_per_encode", 4)
    state = clicked_state(predictor, clip)
    batches = encoder_batches(predictor, monkeypatch)
    tracked = predictor.propagate_in_video(state)
    next(tracked), next(tracked)  # frame 0 (prompted), frame 1 (frames 1-4 encoded)
    tracked.close()
    x, y = clip.frames.shape[2] // 2, clip.frames.shape[1] // 2
    predictor.add_new_points_or_box(state, 5, 9, points=[[x, y]], labels=[1])
    assert batches == [4, 1]


def test_frames_per_encode_below_one_is_refused(predictor):
    with pytest.raises(ValueError, match="frames_per_encode must be at least 1"):
        type(predictor)(predictor.model, frames_per_encode=0)
