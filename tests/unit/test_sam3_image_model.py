"""SAM 3's image model (samfast.sam3.image_model) and its processor equal sam3 0.1.4's Sam3Image and
Sam3Processor in fp32 on the CPU.

sam3's Sam3Image is assembled as its model builder assembles it, every module at SAM3_REDUCED's sizes
(112 px images, an 8 x 8 token grid, width 32, two layers each; tests/sam3_modules.py), every
parameter seeded, and loaded strictly into samfast's model built from the same config. Both get the
same images, phrases, boxes and points.

Tolerance rtol = atol = 1e-5: samfast's attentions go through SDPA where some of sam3's write the
softmax out, and the scores and boxes of only the last decoder layer are computed; that reorders fp32
arithmetic only (measured max abs diff 5e-6 on mask logits of magnitude 10, 1e-6 elsewhere). The
planted-defect tests show each comparison fails on a perturbed weight, a dropped prompt part and a
score without the presence term. The model's forward makes no host sync (a planted .item() is seen).
At the real sizes: the state dict's layout equals sam3's and the recorded sam3.pt image layouts; a phrase
through the full-size model and sam3's is tests/gpu/test_sam3_full_size_gpu.py (minutes on a CPU, a
second on a GPU).
"""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import numpy as np
import pytest
import torch

# through the harness, whose import of sam3 keeps TF32 as it was (sam3 turns it on at import with a GPU)
pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")
pytest.importorskip("open_clip", reason="SAM 3's tokenizer needs open_clip_torch")

from PIL import Image  # noqa: E402
from sam3.model.data_misc import FindStage  # noqa: E402
from sam3.model.geometry_encoders import Prompt as Sam3Prompt  # noqa: E402
from sam3.model.sam3_image_processor import Sam3Processor as TheirProcessor  # noqa: E402

from samfast.sam3.config import SAM3_IMAGE, SAM3_REDUCED, build_image_model  # noqa: E402
from samfast.sam3.geometric_prompt import Prompt  # noqa: E402
from samfast.sam3.image_model import FindInput  # noqa: E402
from samfast.sam3.processor import Sam3Processor  # noqa: E402
from tests.sam3_modules import sam3_image_model, seed_image_model_weights  # noqa: E402
from tests.sam3_reference import layout, on_cpu, read_layouts  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)
PHRASES = ["cat", "a red dog on the grass", "x"]
# three prompts over two images: two phrases on image 0, one on image 1
IDS = dict(img_ids=torch.tensor([0, 0, 1]), text_ids=torch.tensor([0, 1, 2]))
OUTPUT_KEYS = ("pred_logits", "pred_boxes", "pred_boxes_xyxy", "presence_logit_dec", "pred_masks", "semantic_seg",
               "queries", "presence_feats", "encoder_hidden_states")


@pytest.fixture(scope="module")
def models():
    theirs = sam3_image_model(SAM3_REDUCED)
    seed_image_model_weights(theirs, seed=0)
    ours = build_image_model(SAM3_REDUCED)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours.eval(), theirs.eval()


def images(batch: int = 2) -> torch.Tensor:
    size = SAM3_REDUCED.image_size
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def right_padding(real: list[int], length: int) -> torch.Tensor:
    """(P, length) True after each prompt's `real` entries."""
    return torch.arange(length)[None] >= torch.tensor(real)[:, None]


def geometry(case: str) -> dict:
    """Prompt keyword arguments for the three prompts: none, or boxes and points with padding (one prompt
    with no real box) and both labels."""
    if case == "text":
        return dict(box_embeddings=torch.zeros(0, 3, 4), box_mask=torch.zeros(3, 0, dtype=torch.bool))
    g = torch.Generator().manual_seed(3)
    centres, sizes = 0.2 + 0.6 * torch.rand(2, 3, 2, generator=g), 0.1 + 0.4 * torch.rand(2, 3, 2, generator=g)
    return dict(
        box_embeddings=torch.cat([centres, sizes], dim=-1),
        box_mask=right_padding([2, 1, 0], 2),
        box_labels=torch.tensor([[1, 0, 1], [0, 1, 1]]),
        point_embeddings=torch.rand(3, 3, 2, generator=g),
        point_mask=right_padding([3, 1, 2], 3),
        point_labels=torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 1]]),
    )


@torch.no_grad()
def run_sam3(theirs, case: str) -> dict:
    with on_cpu():
        backbone_out = theirs.backbone.forward_image(images())
        backbone_out.update(theirs.backbone.forward_text(PHRASES, device="cpu"))
        find_input = FindStage(**IDS, input_boxes=None, input_boxes_mask=None, input_boxes_label=None,
                               input_points=None, input_points_mask=None)
        return theirs.forward_grounding(backbone_out=backbone_out, find_input=find_input, find_target=None,
                                        geometric_prompt=Sam3Prompt(**geometry(case)))


@torch.no_grad()
def run_ours(ours, case: str) -> dict:
    backbone_out = ours.backbone.forward_image(images())
    backbone_out.update(ours.backbone.forward_text(PHRASES))
    return ours.forward_grounding(backbone_out, FindInput(**IDS), Prompt(**geometry(case)))


@pytest.fixture(scope="module")
def sam3_outputs(models):
    return {case: run_sam3(models[1], case) for case in ("text", "boxes-and-points")}


def assert_outputs_equal(got: dict, ref: dict, keys=OUTPUT_KEYS) -> None:
    for key in keys:
        assert got[key].shape == ref[key].shape and got[key].dtype == ref[key].dtype, key
        torch.testing.assert_close(got[key], ref[key], **TOL, msg=lambda m: f"{key}: {m}")


def assert_outputs_differ(got: dict, ref: dict, keys=OUTPUT_KEYS) -> None:
    with pytest.raises(AssertionError):
        assert_outputs_equal(got, ref, keys)


def test_state_dicts_load_both_ways_strictly(models):
    ours, theirs = models
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert set(ours_state) == set(theirs_state)
    assert all(ours_state[k].shape == theirs_state[k].shape for k in theirs_state)
    sam3_image_model(SAM3_REDUCED).load_state_dict(ours_state, strict=True)


def test_real_size_state_dict_has_sam3s_keys_and_shapes():
    """At SAM3_IMAGE's sizes, built on the meta device (no memory, no init). sam3's ViT reads its
    drop-path rates (training only) with .item(), which a meta tensor cannot give: its linspace runs on
    the CPU here."""
    cpu_linspace = torch.linspace
    linspace_on_cpu = mock.patch.object(torch, "linspace", lambda *a, **k: cpu_linspace(*a, **k, device="cpu"))
    with torch.device("meta"), linspace_on_cpu:
        theirs = sam3_image_model(SAM3_IMAGE).state_dict()
        ours = build_image_model(SAM3_IMAGE).state_dict()
    assert set(ours) == set(theirs)
    assert {k: (v.shape, v.dtype) for k, v in ours.items()} == {k: (v.shape, v.dtype) for k, v in theirs.items()}
    assert theirs["transformer.decoder.query_embed.weight"].shape == (200, 256)
    assert theirs["backbone.vision_backbone.trunk.pos_embed"].shape == (1, 1 + 24 * 24, 1024)


def test_real_size_layouts_are_sam3_pts():
    """The layouts tests/sam3_reference.py recorded from sam3's own builder, which sam3.pt maps onto
    (samfast.sam3.checkpoint): the image model's, and with the neck's second branch the interactive
    image model's less its SAM 1 task predictor (which samfast does not build here)."""
    from samfast.sam3.checkpoint import INTERACTIVE_PREFIX

    layouts = read_layouts()
    with torch.device("meta"):
        assert layout(build_image_model(SAM3_IMAGE).state_dict()) == layouts["image"]
        with_sam2_neck = layout(build_image_model(replace(SAM3_IMAGE, add_sam2_neck=True)).state_dict())
    interactive = layouts["image_interactive"]
    assert with_sam2_neck == {k: v for k, v in interactive.items() if not k.startswith(INTERACTIVE_PREFIX)}
    assert len(with_sam2_neck) > len(layouts["image"])


def test_a_sam3_pt_layout_reads_into_the_model(models, sam3_outputs):
    """sam3.pt holds the image model under `detector.` beside the tracker: samfast.sam3.checkpoint maps it
    onto this model's keys (the tracker's left out), and the model loaded from it gives sam3's outputs."""
    from samfast.sam3.checkpoint import DETECTOR_PREFIX, TRACKER_PREFIX, read_sam3_checkpoint

    _, theirs = models
    official = {DETECTOR_PREFIX + k: v for k, v in theirs.state_dict().items()}
    official[TRACKER_PREFIX + "sam_mask_decoder.conv_s0.weight"] = torch.zeros(8, 32, 1, 1)
    ours = build_image_model(SAM3_REDUCED)
    expected = {k: v.shape for k, v in ours.state_dict().items()}
    ours.load_state_dict(read_sam3_checkpoint({"model": official}, expected), strict=True)
    assert_outputs_equal(run_ours(ours.eval(), "text"), sam3_outputs["text"])


@pytest.mark.parametrize("case", ["text", "boxes-and-points"])
def test_forward_grounding_equals_sam3(models, sam3_outputs, case):
    got, ref = run_ours(models[0], case), sam3_outputs[case]
    assert_outputs_equal(got, ref)
    assert got["presence_logit"] is None and ref["presence_logit"] is None
    assert got["pred_masks"].shape == (3, SAM3_REDUCED.num_queries, 32, 32)


def test_geometry_changes_the_outputs(sam3_outputs):
    """The two cases are different enough that the comparison tells them apart."""
    assert_outputs_differ(sam3_outputs["text"], sam3_outputs["boxes-and-points"])


# a weight of each part, and the output it must show in: the geometry encoder's CLS token (in every
# prompt, text alone too), the text projection, the box head's last layer, the mask head, and the
# neck's 4x level, which only the mask head reads
PERTURBED = {
    "geometry_encoder.cls_embed.weight": "pred_logits",
    "backbone.language_backbone.resizer.weight": "pred_logits",
    "transformer.decoder.bbox_embed.layers.2.weight": "pred_boxes",
    "segmentation_head.instance_seg_head.weight": "pred_masks",
    "backbone.vision_backbone.convs.0.conv_3x3.weight": "pred_masks",
}


@pytest.mark.parametrize("name", PERTURBED)
def test_a_perturbed_weight_fails_the_comparison(models, sam3_outputs, name):
    _, theirs = models
    perturbed = build_image_model(SAM3_REDUCED)
    perturbed.load_state_dict(theirs.state_dict(), strict=True)
    weight = perturbed.get_parameter(name)
    with torch.no_grad():
        # noise, not a constant: a LayerNorm after it would remove a constant shift across channels
        weight.add_(1e-3 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(6)))
    assert_outputs_differ(run_ours(perturbed.eval(), "text"), sam3_outputs["text"], keys=(PERTURBED[name],))


def test_a_dropped_geometry_prompt_fails_the_comparison(models, sam3_outputs):
    """The geometry tokens left out of the prompt (text tokens alone) show in the scores and the masks."""
    ours = models[0]
    encode = ours.geometry_encoder.forward

    def no_geometry(*args, **kwargs):
        tokens, mask = encode(*args, **kwargs)
        return tokens[:0], mask[:, :0]

    with mock.patch.object(ours.geometry_encoder, "forward", no_geometry):
        got = run_ours(ours, "boxes-and-points")
    assert_outputs_differ(got, sam3_outputs["boxes-and-points"], keys=("pred_logits",))
    assert_outputs_differ(got, sam3_outputs["boxes-and-points"], keys=("pred_masks",))


# ---------------------------------------------------------------------------------------------------
# the processor


def pil_image(seed: int, size: tuple[int, int] = (150, 90)) -> Image.Image:
    """A (width, height) RGB image that is not square, so a swap of width and height would show."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def processors(models, threshold: float = 0.0):
    ours, theirs = models
    return (Sam3Processor(ours, resolution=SAM3_REDUCED.image_size, device="cpu", confidence_threshold=threshold),
            TheirProcessor(theirs, resolution=SAM3_REDUCED.image_size, device="cpu", confidence_threshold=threshold))


RESULT_KEYS = ("masks_logits", "boxes", "scores")


def assert_results_equal(got: dict, ref: dict) -> None:
    for key in RESULT_KEYS:
        assert got[key].shape == ref[key].shape and got[key].dtype == ref[key].dtype, key
        torch.testing.assert_close(got[key], ref[key], **TOL, msg=lambda m: f"{key}: {m}")
    assert got["masks"].dtype == torch.bool
    # a mask probability within fp32 noise of 0.5 may round either way
    near_half = (ref["masks_logits"] - 0.5).abs() < 1e-5
    assert torch.equal(got["masks"] | near_half, ref["masks"] | near_half)
    assert (got["original_height"], got["original_width"]) == (ref["original_height"], ref["original_width"])


def test_processor_preprocessing_equals_sam3s(models):
    ours, theirs = processors(models)
    image = pil_image(seed=0)
    expected = theirs.transform(torch.from_numpy(np.array(image)).permute(2, 0, 1))
    torch.testing.assert_close(ours.transform(image), expected, rtol=0, atol=0)
    assert expected.shape == (3, SAM3_REDUCED.image_size, SAM3_REDUCED.image_size)


def test_processor_equals_sam3s_for_phrases_and_boxes(models):
    ours, theirs = processors(models)
    image = pil_image(seed=0)
    with on_cpu():
        ref_state = theirs.set_image(image)
        got_state = ours.set_image(image)
        assert (got_state["original_height"], got_state["original_width"]) == (90, 150)
        for phrase in PHRASES:
            ref, got = theirs.set_text_prompt(phrase, ref_state), ours.set_text_prompt(phrase, got_state)
            assert got["scores"].shape == (SAM3_REDUCED.num_queries,)  # threshold 0 keeps every query
            assert got["masks"].shape == (SAM3_REDUCED.num_queries, 1, 90, 150)  # sam3 keeps the channel
            assert_results_equal(got, ref)
        # a positive then a negative example box on top of the last phrase
        for box, label in (([0.4, 0.5, 0.3, 0.4], True), ([0.7, 0.3, 0.2, 0.2], False)):
            assert_results_equal(ours.add_geometric_prompt(box, label, got_state),
                                 theirs.add_geometric_prompt(box, label, ref_state))
        # boxes alone: the phrase falls back to "visual"
        ours.reset_all_prompts(got_state)
        theirs.reset_all_prompts(ref_state)
        assert set(got_state) == set(ref_state) == {"backbone_out", "original_height", "original_width"}
        assert_results_equal(ours.add_geometric_prompt([0.5, 0.5, 0.5, 0.5], True, got_state),
                             theirs.add_geometric_prompt([0.5, 0.5, 0.5, 0.5], True, ref_state))


def test_processor_threshold_keeps_what_sam3s_keeps(models):
    ours, theirs = processors(models)
    image = pil_image(seed=1)
    with on_cpu():
        ref_state, got_state = theirs.set_image(image), ours.set_image(image)
        scores = theirs.set_text_prompt(PHRASES[1], ref_state)["scores"]
        ours.set_text_prompt(PHRASES[1], got_state)
        # halfway between two scores, so that fp32 noise cannot move one across
        threshold = scores.sort().values[len(scores) // 2 - 1 : len(scores) // 2 + 1].mean().item()
        ref = theirs.set_confidence_threshold(threshold, ref_state)
        got = ours.set_confidence_threshold(threshold, got_state)
    assert 0 < len(got["scores"]) < SAM3_REDUCED.num_queries
    assert_results_equal(got, ref)


def test_scores_without_presence_fail_the_processor_comparison(models):
    ours, theirs = processors(models)
    image = pil_image(seed=0)
    with on_cpu():
        ref = theirs.set_text_prompt(PHRASES[0], theirs.set_image(image))
        state = ours.set_image(image)
        without_presence = lambda outputs: outputs["pred_logits"].sigmoid().squeeze(-1)  # noqa: E731
        with mock.patch("samfast.sam3.processor.detection_scores", without_presence):
            got = ours.set_text_prompt(PHRASES[0], state)
    with pytest.raises(AssertionError, match="scores"):
        assert_results_equal(got, ref)


def test_processor_image_batch_equals_sam3s(models):
    ours, theirs = processors(models)
    batch = [pil_image(seed=0), pil_image(seed=1, size=(64, 80))]
    got, ref = ours.set_image_batch(batch), theirs.set_image_batch(batch)
    assert (got["original_heights"], got["original_widths"]) == (ref["original_heights"], ref["original_widths"])
    assert got["original_widths"] == [150, 64]
    for key in ("backbone_fpn", "vision_pos_enc"):
        assert len(got["backbone_out"][key]) == len(ref["backbone_out"][key]) == 3  # the 0.5x level scalped
        for level, ref_level in zip(got["backbone_out"][key], ref["backbone_out"][key]):
            assert level.shape[0] == 2
            torch.testing.assert_close(level, ref_level, **TOL)
    assert got["backbone_out"]["sam2_backbone_out"] is ref["backbone_out"]["sam2_backbone_out"] is None


def test_processor_reads_arrays_and_tensors_as_the_pil_image(models):
    ours, _ = processors(models)
    image = pil_image(seed=0)
    expected = ours.set_text_prompt(PHRASES[0], ours.set_image(image))
    for same in (np.array(image), torch.from_numpy(np.array(image)).permute(2, 0, 1)):
        got = ours.set_text_prompt(PHRASES[0], ours.set_image(same))
        assert (got["original_height"], got["original_width"]) == (90, 150)
        for key in RESULT_KEYS:
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)


def test_processor_refuses_a_prompt_before_an_image(models):
    ours, _ = processors(models)
    with pytest.raises(ValueError, match="call set_image"):
        ours.set_text_prompt("cat", {})
    with pytest.raises(ValueError, match="PIL image"):
        ours.set_image("cat.jpg")


# ---------------------------------------------------------------------------------------------------
# written for speed: no host sync in the model's forward


def forward_syncs(ours) -> list[str]:
    # the geometry and mask tests' recorder of the ops that make a host wait for the device
    from tests.unit.test_sam3_geometry_and_masks import HostSyncs

    backbone_out = ours.backbone.forward_image(images())
    backbone_out.update(ours.backbone.forward_text(PHRASES))
    prompt = Prompt(**geometry("boxes-and-points"))
    with torch.no_grad(), HostSyncs() as syncs:
        ours.forward_grounding(backbone_out, FindInput(**IDS), prompt)
    return syncs.found


def test_forward_grounding_makes_no_host_sync(models):
    assert forward_syncs(models[0]) == []


def test_a_planted_item_is_seen_as_a_host_sync(models):
    ours = models[0]
    scoring = ours.dot_prod_scoring.forward

    def scoring_with_item(hs, prompt, prompt_mask):
        prompt_mask.any().item()
        return scoring(hs, prompt, prompt_mask)

    with mock.patch.object(ours.dot_prod_scoring, "forward", scoring_with_item):
        assert forward_syncs(ours) == ["_local_scalar_dense"]
