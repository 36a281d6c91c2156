"""Run one stage of a video tracker over the generated clips: the same prompts, the same calls, for the
golden and for every stage, so only the model differs.

Prompts: one foreground click per object, at the ground truth's centre point (the point task's
policy, parity.golden.data.centre_point) on the first frame where the object is visible; then one
forward propagation over the whole clip. Outputs: per clip, object and frame the video-resolution
mask (logits > 0) and the object score logit (> 0: present), and the video-resolution logits of a
bounded subset (LOGITS_FRAMES per clip). The object scores are what seeded weights can be gated on:
they come from the memory-conditioned features before the "absent" decision, so a change in memory
or pointers moves them even where seeded weights call every object absent (masks all empty).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from parity.golden.data import centre_point
from parity.golden.videos import Clip
from samfast.video import NO_OBJ_SCORE, Tracker

PROMPT_POLICY = "video-first-visible-centre-click-v1"  # recorded: another policy is another golden
LOGITS_FRAMES = 2  # per clip, the logits of every object on the clip's first and last frame (fp16 in the golden)
DEFAULT_INPUT_SIZE = 256
# switch -> why the tracker never reads it (its reports say "not applicable"): objects tracked in one
# step share its shapes (one prompt each), so there is no ragged batch of prompts to nest
IGNORED_SWITCHES = {"nt": "the tracker decodes one prompt per object per step: no ragged batch of prompts to nest"}


@dataclass
class ClipOutputs:
    video_id: int
    masks: np.ndarray  # (objects, T, H, W) bool
    object_scores: np.ndarray  # (objects, T) float32 object score logits
    logits: dict[int, np.ndarray]  # frame -> (objects, H, W) float32 video-res logits, frames of logits_frames()
    seconds: float = 0.0


def logits_frames(num_frames: int) -> tuple[int, ...]:
    """The frames whose logits are kept: the first (prompted, no memory) and the last (the most memory)."""
    return (0, num_frames - 1)[:LOGITS_FRAMES]


def prompts(clip: Clip) -> list[tuple[int, int, tuple[float, float]]]:
    """(object id, frame, (x, y)) of each object's one click; an object never visible gets none."""
    found = []
    for obj, obj_id in enumerate(clip.object_ids):
        frame = next((t for t in range(len(clip.frames)) if clip.visible(obj, t)), None)
        if frame is not None:
            found.append((obj_id, frame, centre_point(clip.masks[obj, frame])))
    return found


def at_input_size(model: Tracker, size: int) -> Tracker:
    """The tracker on size x size inputs (Tracker.use_input_size; SAM 2's as sam2's ++model.image_size=size
    builds it). 256 instead of 1024 makes a tracking step ~10x cheaper on a CPU (16 x 16 features, memory
    attention 1/256), with every operation the same (tests/unit/test_sam2_video.py)."""
    model.use_input_size(size)
    return model


@torch.inference_mode()
def track_clip(predictor, clip: Clip) -> ClipOutputs:
    """The clip through the predictor: prompts, then one forward propagation."""
    start = time.perf_counter()
    num_objects, num_frames, height, width = clip.masks.shape
    masks = np.zeros((num_objects, num_frames, height, width), dtype=bool)
    keep = logits_frames(num_frames)
    logits: dict[int, np.ndarray] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fill-hole warnings without the CUDA extension
        state = predictor.init_state(list(clip.frames))
        clicks = prompts(clip)
        for obj_id, frame, (x, y) in clicks:
            predictor.add_new_points_or_box(state, frame, obj_id, points=np.array([[x, y]], dtype=np.float32),
                                            labels=np.array([1], dtype=np.int32))
        for frame, obj_ids, video_logits in predictor.propagate_in_video(state, start_frame_idx=0):
            values = video_logits[:, 0].float().cpu().numpy()
            rows = [clip.object_ids.index(i) for i in obj_ids]
            masks[rows, frame] = values > 0
            if frame in keep:
                full = np.full((num_objects, height, width), NO_OBJ_SCORE, dtype=np.float32)  # an object not tracked
                full[rows] = values
                logits[frame] = full
        scores = np.full((num_objects, num_frames), np.nan, dtype=np.float32)
        for obj_id, obj in zip(state.obj_ids, state.objects):
            for frame in range(num_frames):
                out = obj.memory.get(frame)
                if out is not None:
                    scores[clip.object_ids.index(obj_id), frame] = out.object_score_logits.float().item()
    return ClipOutputs(clip.video_id, masks, scores, logits, time.perf_counter() - start)


def track_all(build: Callable[[], object], clips: list[Clip]) -> list[ClipOutputs]:
    predictor = build()
    return [track_clip(predictor, clip) for clip in clips]
