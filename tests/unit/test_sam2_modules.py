"""SAM 2.1 modules equal the sam2 package (1.1.0) in fp32 with the same weights, part by part.

Weights: samfast's seeded synthetic sam2.1_hiera_t, loaded strictly into sam2's model (non-zero
positional tables, so the windowed pos-embed interpolation really runs); and sam2's own init
loaded strictly into samfast's. The trunk and neck run on a 256 x 256 input: every stage still
pads its windows (14-windows on a 16 map, 7-windows on an 8 map), the global blocks attend over
the whole map and the background pos-embed is interpolated, at 1/16 of the CPU time of 1024 x 1024
(tests/unit/test_sam2_predictor.py runs the full size end to end).

Tolerances: samfast's SAM 2 modules run the reference's operations in the reference's order
(SDPA where sam2 uses SDPA), so on one machine the outputs are the same bits; measured max abs
diff 0.0 for every output here. The asserts are exact; a future change that reorders the
arithmetic must say so by loosening them with a measured tolerance.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sam2", reason="the SAM 2 reference package sam2==1.1.0 is not installed")

from samfast.sam2.build import build_sam2_model
from samfast.sam2.config import SAM2_MODEL_TYPES, sam2_config
from samfast.sam2.sam2_base import build_sam2_modules
from parity.reference import sam2_reference_config

MODEL_TYPE = "sam2.1_hiera_t"


def assert_same(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


@pytest.fixture(scope="module")
def models():
    """(samfast model, sam2 model with samfast's weights, sam2's own initial state dict)."""
    from sam2.build_sam import build_sam2

    torch.manual_seed(0)
    ref = build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", ckpt_path=None, device="cpu")
    ref_init = {k: v.clone() for k, v in ref.state_dict().items()}
    # sam2's own attention path, so the same bits; the fp32 stage writes the softmax out, SAM 1's
    # reference order, within fp32 rounding of it (tests/unit/test_sam2_stages.py)
    ours = build_sam2_model(MODEL_TYPE, device="cpu", stages="fp32+sdpa")
    ref.load_state_dict(ours.state_dict(), strict=True)
    return ours, ref, ref_init


def test_reference_weights_load_strictly_into_samfast(models):
    _, _, ref_init = models
    ours = build_sam2_model(MODEL_TYPE, {"model": ref_init}, device="cpu")
    for key, value in ours.state_dict().items():
        assert torch.equal(value, ref_init[key]), key


@pytest.mark.parametrize("model_type", SAM2_MODEL_TYPES)
def test_state_dict_layout_equals_each_reference_config(model_type, monkeypatch):
    """Every key and shape of each config, built on the meta device (no memory, no init): sam2's own config
    for an official type, its hiera_t config reshaped by hydra overrides for the project's (nano, 5block)."""
    import sam2.build_sam  # noqa: F401  (initializes hydra's config module)
    from hydra import compose
    from hydra.utils import instantiate

    # Hiera's drop-path schedule calls .item() on a linspace, which the meta device cannot
    linspace = torch.linspace
    monkeypatch.setattr(torch, "linspace", lambda *a, **k: linspace(*a, **{**k, "device": "cpu"}))
    config, overrides = sam2_reference_config(model_type)
    cfg = compose(config_name=config, overrides=overrides)
    with torch.device("meta"):
        ref = instantiate(cfg.model, _recursive_=True)
        ours = build_sam2_modules(sam2_config(model_type))
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}


@pytest.fixture(scope="module")
def encoder_outputs(models):
    ours, ref, _ = models
    image = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        trunk = ours.image_encoder.trunk(image), ref.image_encoder.trunk(image)
        # each neck on its own trunk's output, so a trunk difference would show here too
        necks = ours.image_encoder.neck(trunk[0]), ref.image_encoder.neck(trunk[1])
    return trunk, necks


def test_trunk_stages_equal(encoder_outputs):
    ours, ref = encoder_outputs[0]
    assert [tuple(x.shape[1:]) for x in ours] == [(96, 64, 64), (192, 32, 32), (384, 16, 16), (768, 8, 8)]
    for o, r in zip(ours, ref):
        assert_same(o, r)


@pytest.mark.parametrize("output", ["features", "positional encodings"])
def test_neck_levels_equal(encoder_outputs, output):
    index = ["features", "positional encodings"].index(output)
    ours, ref = (neck[index] for neck in encoder_outputs[1])
    assert len(ours) == len(ref) == 4
    for o, r in zip(ours, ref):
        assert_same(o, r)


def _prompts(batch: int = 3):
    g = torch.Generator().manual_seed(2)
    coords = torch.rand(batch, 5, 2, generator=g) * 1024
    labels = torch.tensor([[1, 0, -1, 2, 3], [1, 1, 0, 0, -1], [2, 3, 1, 0, 1]], dtype=torch.int32)[:batch]
    masks = torch.randn(batch, 1, 256, 256, generator=g)
    return coords, labels, masks


@pytest.mark.parametrize("with_masks", [False, True])
@pytest.mark.parametrize("with_boxes", [False, True])
def test_prompt_encoder_equal(models, with_boxes, with_masks):
    ours, ref, _ = models
    coords, labels, masks = _prompts()
    boxes = coords[:, :2].reshape(-1, 4) if with_boxes else None
    masks = masks if with_masks else None
    with torch.no_grad():
        o = ours.sam_prompt_encoder(points=(coords, labels), boxes=boxes, masks=masks)
        r = ref.sam_prompt_encoder(points=(coords, labels), boxes=boxes, masks=masks)
        assert_same(ours.sam_prompt_encoder.get_dense_pe(), ref.sam_prompt_encoder.get_dense_pe())
    assert_same(o[0], r[0])
    assert_same(o[1].contiguous(), r[1].contiguous())


@pytest.mark.parametrize("multimask_output, repeat_image", [(True, True), (False, True), (False, False)])
def test_mask_decoder_equal(models, multimask_output, repeat_image):
    """Masks, IoUs, SAM tokens and object scores, with the high-res features; single-mask output
    goes through the dynamic fallback to the most stable mask (build_sam2's apply_postprocessing)."""
    ours, ref, _ = models
    g = torch.Generator().manual_seed(3)
    batch = 2
    images = 1 if repeat_image else batch
    embedding = torch.randn(images, 256, 64, 64, generator=g)
    high_res = [torch.randn(images, 32, 256, 256, generator=g), torch.randn(images, 64, 128, 128, generator=g)]
    coords, labels, _ = _prompts(batch)
    with torch.no_grad():
        sparse, dense = ref.sam_prompt_encoder(points=(coords, labels), boxes=None, masks=None)
        args = dict(
            image_embeddings=embedding,
            image_pe=ref.sam_prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=multimask_output,
            repeat_image=repeat_image,
            high_res_features=high_res,
        )
        outputs = ours.sam_mask_decoder(**args), ref.sam_mask_decoder(**args)
    assert ours.sam_mask_decoder.dynamic_multimask_via_stability and ref.sam_mask_decoder.dynamic_multimask_via_stability
    for o, r in zip(*outputs):  # masks, iou predictions, sam tokens, object score logits
        assert_same(o, r)


def test_memory_encoder_and_attention_equal(models):
    """The video parts the checkpoint holds compute what sam2's do (small maps, random inputs)."""
    ours, ref, _ = models
    g = torch.Generator().manual_seed(4)
    pix_feat = torch.randn(2, 256, 16, 16, generator=g)
    masks = torch.randn(2, 1, 256, 256, generator=g)
    with torch.no_grad():
        o, r = ours.memory_encoder(pix_feat, masks), ref.memory_encoder(pix_feat, masks)
        assert_same(o["vision_features"], r["vision_features"])
        assert_same(o["vision_pos_enc"][0], r["vision_pos_enc"][0])

        tokens = 16 * 16
        curr = torch.randn(tokens, 2, 256, generator=g)
        curr_pos = torch.randn(tokens, 2, 256, generator=g)
        num_ptr = 4  # two memory frames, then object-pointer tokens that are not rotated
        memory = torch.randn(2 * tokens + num_ptr, 2, 64, generator=g)
        memory_pos = torch.randn(2 * tokens + num_ptr, 2, 64, generator=g)
        args = dict(curr=curr, memory=memory, curr_pos=curr_pos, memory_pos=memory_pos, num_obj_ptr_tokens=num_ptr)
        assert_same(ours.memory_attention(**args), ref.memory_attention(**args))
