"""The video task's picture: a failed or near-failing stage's worst object-frame, the golden's mask and the
stage's over the frame (parity.report.pictures)."""

from __future__ import annotations

from parity.compare.gates import StageResult
from parity.golden.videos import Clip
from parity.report.pictures import mask_comparison_png


def worst_frame_picture(result: StageResult, clips: list[Clip]) -> dict[int, bytes]:
    """{0: PNG} of the stage's worst object-frame: the frame, the golden's mask and the stage's over it, and
    where they differ (parity.report.pictures); {} when the stage tracked nothing."""
    if not result.worst_masks:
        return {}
    w = result.worst[0]
    frame = next(c for c in clips if c.video_id == w["video_id"]).frames[w["frame"]]
    golden_mask, stage_mask = result.worst_masks[0]
    title = (f"{result.stage}: clip {w['video_id']}, object {w['object_id']}, frame {w['frame']}: J {w['j']:.3f}, "
             f"F {w['f']:.3f} vs golden (J&F vs ground truth {w['jf_gt']:.3f}, the golden's {w['golden_jf_gt']:.3f})")
    return {0: mask_comparison_png(frame, golden_mask, stage_mask, title=title, image_label=f"frame {w['frame']}")}
