"""samfast's full vit_b equals segment_anything's in fp32 on a GPU (TF32 off), on a real photo.

The CPU tests prove vit_tiny's numerics on real images and every model type's layout
(tests/unit/test_reference_parity.py); this runs the full 12-block vit_b at 1024 px end to end, which
takes a minute of a CPU and a second of a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import samfast
from parity.reference import reference_sam
from tests.reference import assert_same_outputs
from tests.reference import prompt_cases as _prompt_cases
from tests.stage_accuracy import tf32_off

pytestmark = pytest.mark.gpu


def test_vit_b_end_to_end_equals_reference(data_root):
    from segment_anything import SamPredictor as ReferencePredictor

    state = samfast.synthetic_state_dict("vit_b", seed=1)
    ours = samfast.SamPredictor(samfast.build_sam("vit_b", seed=1, device="cuda"))
    ref = ReferencePredictor(reference_sam("vit_b", state).to("cuda"))
    image = np.array(Image.open(data_root / "sam-demo" / "truck.jpg").convert("RGB"))
    with tf32_off():
        ours.set_image(image)
        ref.set_image(image)
        for case in _prompt_cases(*image.shape[:2])[::3]:
            assert_same_outputs(ours.predict(**case), ref.predict(**case, return_logits=True))
