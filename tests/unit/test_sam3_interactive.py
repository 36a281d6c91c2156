"""SAM 3's point and box prompts (predict_inst, samfast.sam3.interactive) equal sam3 0.1.4's in fp32 on the CPU.

sam3's reduced image model (tests/sam3_modules.py) with the neck's second branch and its
SAM3InteractiveImagePredictor over the tracker's heads at the reduced width, every parameter seeded, loaded
strictly into samfast's model built with enable_inst_interactivity. Both processors set the same image
(which passes two feature levels through the decoder's conv_s0 / conv_s1), then the same prompts: points,
a box, both, one mask or three, a previous low-resolution mask, several boxes at once, and a batch of
images. Tolerance as the image model's (tests/unit/test_sam3_image_model.py). Both fill the small holes of
the low-resolution masks: sam3 with its CPU path's labelling (scikit-image's label, the harness's scipy
stand-in here), samfast with its own connected components.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")
pytest.importorskip("open_clip", reason="SAM 3's tokenizer needs open_clip_torch")

from sam3.model.sam3_image_processor import Sam3Processor as TheirProcessor  # noqa: E402

from samfast.sam3.config import SAM3_REDUCED, build_image_model  # noqa: E402
from samfast.sam3.interactive import MAX_HOLE_AREA  # noqa: E402
from samfast.sam3.processor import Sam3Processor  # noqa: E402
from tests.sam3_modules import sam3_image_model, sam3_interactive_predictor, seed_image_model_weights  # noqa: E402
from tests.sam3_reference import on_cpu  # noqa: E402
from tests.unit.test_sam3_image_model import pil_image  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)
CONFIG = replace(SAM3_REDUCED, add_sam2_neck=True)
# (width, height) of the image: 150 x 90, so a swap of x and y shows
PROMPTS = {
    "one point": dict(point_coords=np.array([[60.0, 40.0]]), point_labels=np.array([1])),
    "two points, one negative, one mask": dict(point_coords=np.array([[60.0, 40.0], [120.0, 70.0]]),
                                               point_labels=np.array([1, 0]), multimask_output=False),
    "a box": dict(box=np.array([20.0, 10.0, 110.0, 80.0])),
    "a box and a point, logits": dict(box=np.array([20.0, 10.0, 110.0, 80.0]), point_coords=np.array([[70.0, 50.0]]),
                                      point_labels=np.array([1]), return_logits=True),
    "two boxes at once": dict(box=np.array([[20.0, 10.0, 110.0, 80.0], [5.0, 5.0, 60.0, 40.0]]), multimask_output=False),
    "normalized coordinates": dict(point_coords=np.array([[0.4, 0.45]]), point_labels=np.array([1]),
                                   normalize_coords=False),
}


@pytest.fixture(scope="module")
def models():
    theirs = sam3_image_model(CONFIG)
    theirs.inst_interactive_predictor = sam3_interactive_predictor(CONFIG)
    seed_image_model_weights(theirs, seed=0)
    ours = build_image_model(SAM3_REDUCED, enable_inst_interactivity=True)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours.eval(), theirs.eval()


def processors(models):
    ours, theirs = models
    return (Sam3Processor(ours, resolution=CONFIG.image_size, device="cpu"),
            TheirProcessor(theirs, resolution=CONFIG.image_size, device="cpu"))


def assert_outputs_equal(got: tuple, want: tuple) -> None:
    """(masks, IoU predictions, low-res logits) of ours and sam3's: same shapes and dtypes, values within TOL."""
    assert len(got) == len(want) == 3
    for name, g, w in zip(("masks", "ious", "low_res"), got, want, strict=True):
        assert isinstance(g, np.ndarray) and g.shape == w.shape and g.dtype == w.dtype, name
        torch.testing.assert_close(torch.from_numpy(g), torch.from_numpy(w), **TOL, msg=lambda m, n=name: f"{n}: {m}")


def predict(model, state, *args, batch: bool = False, **prompt):
    """model.predict_inst (predict_inst_batch with `batch`); a hole filling skipped for want of connected
    components (sam3 without scikit-image warns and goes on) is an error here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="(?s).*(post-processing|connected components)")
        return (model.predict_inst_batch if batch else model.predict_inst)(state, *args, **prompt)


@contextlib.contextmanager
def changed(param: torch.nn.Parameter, change) -> Iterator[None]:
    """`param` changed in place by change(param) inside the block, as it was after (the models are the module's)."""
    saved = param.detach().clone()
    try:
        with torch.no_grad():
            change(param)
        yield
    finally:
        with torch.no_grad():
            param.copy_(saved)


@pytest.mark.parametrize("case", PROMPTS)
def test_predict_inst_equals_sam3s(models, case):
    ours, theirs = processors(models)
    image = pil_image(seed=0)
    with on_cpu():
        want_state, got_state = theirs.set_image(image), ours.set_image(image)
        want = predict(theirs.model, want_state, **PROMPTS[case])
    got = predict(ours.model, got_state, **PROMPTS[case])
    assert_outputs_equal(got, want)
    masks = got[0]
    assert masks.shape[-2:] == (90, 150)
    assert masks.std() > 0  # a prompt that reached the decoder: not one constant mask


def test_the_holes_both_fill_change_the_masks(models):
    """The hole filling ran and mattered: with it off in samfast (max_hole_area 0) some prompt's masks
    differ from sam3's, which the equality above says match with it on."""
    ours, theirs = processors(models)
    image = pil_image(seed=0)
    interactive = ours.model.inst_interactive_predictor
    differing = []
    with on_cpu():
        want_state, got_state = theirs.set_image(image), ours.set_image(image)
        for case, prompt in PROMPTS.items():
            want = predict(theirs.model, want_state, **prompt)
            interactive.max_hole_area = 0.0
            try:
                unfilled = predict(ours.model, got_state, **prompt)
            finally:
                interactive.max_hole_area = MAX_HOLE_AREA
            if not np.array_equal(unfilled[0], want[0]):
                differing.append(case)
    assert differing, "no prompt's masks had a hole of at most 256 low-resolution pixels: the check proves nothing"


def test_a_previous_mask_as_prompt_equals_sam3s(models):
    ours, theirs = processors(models)
    image = pil_image(seed=1)
    point = dict(point_coords=np.array([[50.0, 30.0]]), point_labels=np.array([1]), multimask_output=False)
    with on_cpu():
        want_state, got_state = theirs.set_image(image), ours.set_image(image)
        first = predict(theirs.model, want_state, **point)
        want = predict(theirs.model, want_state, **point, mask_input=first[2])
    got = predict(ours.model, got_state, **point, mask_input=first[2])
    assert_outputs_equal(got, want)


def test_predict_inst_batch_equals_sam3s(models):
    ours, theirs = processors(models)
    images = [pil_image(seed=2), pil_image(seed=3, size=(60, 100))]
    prompts = dict(point_coords_batch=[np.array([[30.0, 20.0]]), np.array([[10.0, 80.0], [40.0, 50.0]])],
                   point_labels_batch=[np.array([1]), np.array([1, 1])], multimask_output=False)
    with on_cpu():
        want_state, got_state = theirs.set_image_batch(images), ours.set_image_batch(images)
        want = predict(theirs.model, want_state, batch=True, **prompts)
    got = predict(ours.model, got_state, batch=True, **prompts)
    for got_outputs, want_outputs in zip(zip(*got, strict=True), zip(*want, strict=True), strict=True):
        assert_outputs_equal(got_outputs, want_outputs)
    assert got[0][1].shape[-2:] == (100, 60)


def test_planted_defect_in_the_high_resolution_path_differs(models):
    """The finest level reaches the masks through conv_s0 (set_image) and the decoder's upscaling: a
    bias moved by 0.01 there moves the outputs past the tolerance."""
    ours, theirs = processors(models)
    image = pil_image(seed=0)
    prompt = PROMPTS["a box"]
    with on_cpu():
        want = predict(theirs.model, theirs.set_image(image), **prompt)
    with changed(ours.model.inst_interactive_predictor.model.sam_mask_decoder.conv_s0.bias, lambda bias: bias.add_(0.01)):
        got = predict(ours.model, ours.set_image(image), **prompt)
    with pytest.raises(AssertionError):
        assert_outputs_equal(got, want)


def test_planted_defect_without_no_mem_embed_differs(models):
    ours, theirs = processors(models)
    image = pil_image(seed=0)
    prompt = PROMPTS["one point"]
    with on_cpu():
        want = predict(theirs.model, theirs.set_image(image), **prompt)
    with changed(ours.model.inst_interactive_predictor.model.no_mem_embed, lambda table: table.zero_()):
        got = predict(ours.model, ours.set_image(image), **prompt)
    with pytest.raises(AssertionError):
        assert_outputs_equal(got, want)


def test_a_model_built_without_interactivity_says_how_to_get_it():
    model = build_image_model(SAM3_REDUCED)
    state = Sam3Processor(model, resolution=SAM3_REDUCED.image_size, device="cpu").set_image(pil_image(seed=0))
    assert state["backbone_out"]["sam2_backbone_out"] is None
    with pytest.raises(RuntimeError, match="enable_inst_interactivity=True"):
        model.predict_inst(state, point_coords=np.array([[1.0, 1.0]]), point_labels=np.array([1]))
