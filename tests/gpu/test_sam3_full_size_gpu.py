"""SAM 3's full-size image model equals sam3 0.1.4's, as sam3 ships it, in fp32 on a GPU (TF32 off).

The CPU tests prove every part at reduced sizes and the full size's layout on the meta device
(tests/unit/test_sam3_image_model.py); this runs one phrase, and points and a box (predict_inst, with
sam3's real feature sizes, which its predictor hard-codes), through both full-size models end to end.
On a GPU sam3 needs no shim, and the two ViT-L/14 trunks take a second where the CPU took minutes.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
# through the harness, whose import of sam3 keeps TF32 as it was (sam3 turns it on at import with a GPU)
pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")
pytest.importorskip("open_clip", reason="SAM 3's tokenizer needs open_clip_torch")

from sam3.model.sam3_image_processor import Sam3Processor as TheirProcessor  # noqa: E402

from samfast.sam3.config import SAM3_IMAGE, build_image_model  # noqa: E402
from samfast.sam3.processor import Sam3Processor  # noqa: E402
from tests.sam3_reference import build_reference_image_model  # noqa: E402
from tests.stage_accuracy import tf32_off  # noqa: E402
from tests.unit.test_sam3_image_model import assert_results_equal, pil_image  # noqa: E402
from tests.unit.test_sam3_interactive import assert_outputs_equal  # noqa: E402


def test_full_size_predict_inst_equals_sam3s():
    """sam3's model built with enable_inst_interactivity on "cuda", its weights but the tracker's video
    parts (which samfast's image model does not hold) loaded strictly into samfast's; points and a box
    through both predict_inst. Both fill the masks' small holes: sam3 with cc_torch or its Triton kernel,
    samfast with samfast.modeling.connected_components."""
    theirs = build_reference_image_model(seed=0, device="cuda", enable_inst_interactivity=True)
    ours = build_image_model(SAM3_IMAGE, enable_inst_interactivity=True)
    keys = ours.state_dict().keys()
    ours.load_state_dict({k: v for k, v in theirs.state_dict().items() if k in keys}, strict=True, assign=True)
    ours = ours.to("cuda").eval()
    image = torch.from_numpy(np.array(pil_image(seed=4, size=(160, 120)))).permute(2, 0, 1).cuda()
    prompts = [dict(point_coords=np.array([[80.0, 60.0], [20.0, 100.0]]), point_labels=np.array([1, 0])),
               dict(box=np.array([30.0, 20.0, 130.0, 100.0]), multimask_output=False)]
    for prompt in prompts:
        with tf32_off(), warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            want = theirs.predict_inst(TheirProcessor(theirs, device="cuda").set_image(image), **prompt)
            got = ours.predict_inst(Sam3Processor(ours, device="cuda").set_image(image), **prompt)
        skipped = [str(w.message) for w in warned if "Skipping the post-processing step" in str(w.message)]
        assert not skipped, f"sam3 skipped its hole filling, so its masks are not what it gives a user: {skipped}"
        assert_outputs_equal(got, want)
        assert got[0].shape[-2:] == (120, 160) and got[2].shape[-2:] == (288, 288)


def test_full_size_text_prompt_equals_sam3s():
    """sam3's image model as its builder makes it on "cuda" (its own seeded init, tests/sam3_reference.py),
    its state dict loaded strictly into samfast's SAM3_IMAGE model; one phrase through both processors."""
    theirs = build_reference_image_model(seed=0, device="cuda")
    ours = build_image_model(SAM3_IMAGE)
    # assign: the two models share their weights rather than holding 3.4 GB each
    ours.load_state_dict(theirs.state_dict(), strict=True, assign=True)
    ours = ours.to("cuda").eval()  # what the state dict does not hold (computed tables) follows the weights
    # a tensor on the GPU, which both resize there (a host image samfast resizes on the host: see
    # Sam3Processor.transform), so the pixels are the same
    image = torch.from_numpy(np.array(pil_image(seed=2, size=(56, 40)))).permute(2, 0, 1).cuda()
    with tf32_off():
        ref = TheirProcessor(theirs, device="cuda", confidence_threshold=0.0)
        ref = ref.set_text_prompt("a red square", ref.set_image(image))
        got = Sam3Processor(ours, device="cuda", confidence_threshold=0.0)
        got = got.set_text_prompt("a red square", got.set_image(image))
    # the reference ran end to end and the phrase reached its outputs
    assert ref["masks_logits"].shape == (SAM3_IMAGE.num_queries, 1, 40, 56) and ref["masks"].dtype == torch.bool
    for name in ("masks_logits", "boxes", "scores"):
        assert ref[name].device.type == "cuda" and ref[name].dtype == torch.float32, name
        assert torch.isfinite(ref[name]).all(), name
    assert ((ref["scores"] >= 0) & (ref["scores"] <= 1)).all()
    assert ref["scores"].std() > 0 and ref["masks_logits"].std() > 0
    assert got["scores"].shape == (SAM3_IMAGE.num_queries,)
    assert_results_equal(got, ref)
