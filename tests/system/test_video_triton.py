"""The triton switch in tracking: Hiera's small-window attentions, the decoder's upscaling, the memory keys and
the mask downsampler's first convs on their kernels (interpreted on the CPU) give fp32 tracking's masks, and no
call falls back. The decoder's cross attentions
stay on the module path for a tracked frame's few prompts (samfast.modeling.sam2_prompting.mask_decoder.MIN_FUSED_PROMPTS:
on an H100 the kernels took 2.8x its time for one prompt).

Seeded sam2.1_hiera_nano at the video gate's 256 input, the gate's generated clip (its objects clicked
where they first appear), the object-score head raised as in test_video_compile.py so that every frame's
logits come from the decoder. The GPU layers run the compiled bf16 stage against the golden
(tests/gpu/test_video_gpu.py).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import samfast
from parity.golden.videos import generate_clip
from parity.tasks.video.produce import at_input_size, prompts
from samfast.kernels import fallback_counts

pytest.importorskip("triton", reason="Triton is not installed")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("triton_interpreted")]

FRAMES, INPUT_SIZE, OBJECT_SCORE_SHIFT = 6, 256, 1.0
# kernel vs module path, both fp32: measured at most 4.7e-5 over the clip (logits up to ~10); bf16
# memories carry each frame's rounding to the next
LOGITS_ATOL = 1e-3


@torch.inference_mode()
def track(stages: str) -> tuple[object, list[torch.Tensor]]:
    predictor = samfast.build_sam_video("sam2.1_hiera_nano", device="cpu", stages=stages)
    at_input_size(predictor.model, INPUT_SIZE)
    predictor.model.sam_mask_decoder.pred_obj_score_head.layers[-1].bias.data += OBJECT_SCORE_SHIFT
    clip = generate_clip(0, frames=FRAMES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fill-hole warnings without the CUDA extension
        state = predictor.init_state(list(clip.frames))
        for obj_id, frame, (x, y) in prompts(clip):
            predictor.add_new_points_or_box(state, frame, obj_id, points=np.array([[x, y]], dtype=np.float32),
                                            labels=np.array([1], dtype=np.int32))
        return predictor, [masks.clone() for _, _, masks in predictor.propagate_in_video(state, start_frame_idx=0)]


@pytest.mark.slow(reason="the tracker's Triton kernels run in the interpreter here (TRITON_INTERPRET), every program simulated in numpy")
def test_tracking_on_the_kernels_equals_fp32():
    predictor, got = track("fp32+triton")
    assert fallback_counts() == {}, "a kernel fell back"
    model = predictor.model
    assert model.triton_attention_modules() and all(m.attn_impl == "triton" for m in model.triton_attention_modules().values())
    assert model.sam_mask_decoder.transformer.fused_cross_attention  # the switch's; routed by prompt count
    assert model.sam_mask_decoder.upscale_impl == "triton"
    assert model.memory_encoder.mask_downsampler.conv_impl == "triton"
    _, want = track("fp32")
    assert len(got) == len(want) == FRAMES
    for frame, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=0, atol=LOGITS_ATOL, msg=lambda m: f"frame {frame}: {m}")
