"""SAM 3's geometry encoder and segmentation head (samfast.sam3) equal sam3 0.1.4's in fp32 on the CPU.

The references are sam3's own modules, built with sam3's classes and the flags of its model builder
(`_create_geometry_encoder`, `_create_segmentation_head`) at small widths, and once by those builders
themselves at the real sizes (width 256, 8 heads, FFN 2048, 3 layers) on small feature maps. Their
seeded weights (every 1-D parameter randomized too, so that no norm or bias is an identity a dropped
term could hide behind) load strictly into ours.

Tolerances: rtol = atol = 1e-5 (outputs of magnitude 1 to 4). The attentions take the SDPA path
torch's MultiheadAttention takes, the rest the reference's operations in its order, so on this
machine every output is the same bits (measured max abs diff 0.0 in every case); the margin is for
BLAS builds that block the q, k, v projections (one GEMM or three) differently. The padding masks
must be equal exactly. Each comparison is shown able to fail: noise on a weight of each path, a
dropped padding mask, a dropped position encoding; and the no-sync and one-graph checks on a
planted .item(), a boolean-mask index and a data-dependent branch.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# through the harness, whose import of sam3 keeps TF32 as it was (sam3 turns it on at import with a GPU)
pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")

from sam3.model.encoder import TransformerEncoderLayer
from sam3.model.geometry_encoders import Prompt as Sam3Prompt
from sam3.model.geometry_encoders import SequenceGeometryEncoder as Sam3GeometryEncoder
from sam3.model.maskformer_segmentation import PixelDecoder as Sam3PixelDecoder
from sam3.model.maskformer_segmentation import UniversalSegmentationHead as Sam3SegmentationHead
from sam3.model.model_misc import MultiheadAttentionWrapper
from sam3.model.position_encoding import PositionEmbeddingSine

from samfast.sam3.geometric_prompt import Prompt
from samfast.sam3.geometry_encoder import SequenceGeometryEncoder
from samfast.sam3.segmentation_head import UniversalSegmentationHead
from tests.sam3_reference import on_cpu

SMALL = {"d_model": 32, "num_heads": 4, "dim_feedforward": 64, "num_layers": 2}
BATCH = 3


def randomize(module: nn.Module, seed: int) -> nn.Module:
    """Seeded weights: sam3's init under torch.manual_seed for matrices and embeddings, and every 1-D
    parameter (norm weights around 1, biases around 0) drawn too; eval mode (no dropout)."""
    torch.manual_seed(seed)
    norms = {id(m.weight) for m in module.modules() if isinstance(m, (nn.LayerNorm, nn.GroupNorm))}
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 1:
                p.copy_(0.2 * torch.randn_like(p) + (1.0 if id(p) in norms else 0.0))
    return module.eval()


def perturb(p: torch.Tensor) -> None:
    """A planted defect: 1e-3 of noise on a weight (noise, not a constant: a constant shift across
    channels is what a LayerNorm after it removes)."""
    with torch.no_grad():
        p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(6)))


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# geometry encoder


def sam3_geometry_encoder(d_model: int, num_heads: int, dim_feedforward: int, num_layers: int) -> Sam3GeometryEncoder:
    """sam3's SequenceGeometryEncoder with the flags of sam3.model_builder._create_geometry_encoder."""

    def attention():
        return MultiheadAttentionWrapper(num_heads=num_heads, dropout=0.1, embed_dim=d_model, batch_first=False)

    layer = TransformerEncoderLayer(
        activation="relu", d_model=d_model, dim_feedforward=dim_feedforward, dropout=0.1, pos_enc_at_attn=False,
        pre_norm=True, self_attention=attention(), pos_enc_at_cross_attn_queries=False,
        pos_enc_at_cross_attn_keys=True, cross_attention=attention(),
    )
    torch.manual_seed(0)
    return Sam3GeometryEncoder(
        pos_enc=PositionEmbeddingSine(num_pos_feats=d_model, normalize=True, temperature=10000),
        encode_boxes_as_points=False, points_direct_project=True, points_pool=True, points_pos_enc=True,
        boxes_direct_project=True, boxes_pool=True, boxes_pos_enc=True, d_model=d_model, num_layers=num_layers,
        layer=layer, use_act_ckpt=True, add_cls=True, add_post_encode_proj=True,
    )


def loaded_pair(ref: nn.Module, ours: nn.Module) -> tuple[nn.Module, nn.Module]:
    randomize(ref, seed=1)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours.eval(), ref


@pytest.fixture(scope="module")
def geometry_pair():
    return loaded_pair(sam3_geometry_encoder(**SMALL), SequenceGeometryEncoder(**SMALL))


def run_reference_geometry(ref, prompt_kwargs, feats, sizes, pos):
    # sam3 pins the (W, H, W, H) box scale, which raises without an accelerator: the harness's shim
    with torch.no_grad(), on_cpu():
        return ref(Sam3Prompt(**prompt_kwargs), feats, sizes, pos)


def run_geometry(ours, prompt_kwargs, feats, sizes, pos):
    with torch.no_grad():
        return ours(Prompt(**prompt_kwargs), feats, sizes, pos)


def image_levels(d_model: int, batch: int = BATCH, seed: int = 2):
    """Two sequence-first levels (the encoder reads the last), with their position encodings and sizes."""
    g = torch.Generator().manual_seed(seed)
    sizes = [(10, 12), (6, 5)]
    feats = [torch.randn(h * w, batch, d_model, generator=g) for h, w in sizes]
    pos = [torch.randn(h * w, batch, d_model, generator=g) for h, w in sizes]
    return feats, sizes, pos


def right_padding(real: list[int], length: int) -> torch.Tensor:
    """(B, length) True after each prompt's `real` entries."""
    return torch.arange(length)[None] >= torch.tensor(real)[:, None]


def geometry_case(name: str, seed: int = 3) -> dict:
    """Prompt keyword arguments: prompts with padding (one with none real), positive and negative labels."""
    g = torch.Generator().manual_seed(seed)
    boxes = torch.cat([0.2 + 0.6 * torch.rand(3, BATCH, 2, generator=g), 0.1 + 0.4 * torch.rand(3, BATCH, 2, generator=g)], -1)
    points = torch.rand(4, BATCH, 2, generator=g)
    box_part = {"box_embeddings": boxes, "box_mask": right_padding([3, 1, 0], 3),
                "box_labels": torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 0]])}
    point_part = {"point_embeddings": points, "point_mask": right_padding([4, 2, 3], 4),
                  "point_labels": torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 1], [0, 0, 1]])}
    cases = {
        "boxes": box_part,
        "points": point_part,
        "boxes_and_points": {**box_part, **point_part},
        # the label-less and mask-less defaults: all positive, nothing padded
        "defaults": {"box_embeddings": boxes, "point_embeddings": points},
        # what sam3's image model passes with a text prompt alone
        "text_only": {"box_embeddings": torch.zeros(0, BATCH, 4), "box_mask": torch.zeros(BATCH, 0, dtype=torch.bool)},
    }
    return cases[name]


def assert_geometry_equal(ours, ref, case: dict, with_pos: bool = True, ours_case: dict | None = None) -> None:
    feats, sizes, pos = image_levels(ref.d_model)
    pos = pos if with_pos else None
    ref_tokens, ref_mask = run_reference_geometry(ref, case, feats, sizes, pos)
    tokens, mask = run_geometry(ours, ours_case or case, feats, sizes, pos)
    assert torch.equal(mask, ref_mask)
    assert_close(tokens, ref_tokens)


@pytest.mark.parametrize("name", ["boxes", "points", "boxes_and_points", "defaults", "text_only"])
def test_geometry_encoder_equals_sam3(geometry_pair, name):
    ours, ref = geometry_pair
    assert_geometry_equal(ours, ref, geometry_case(name))


def test_geometry_encoder_without_position_encodings_equals_sam3(geometry_pair):
    ours, ref = geometry_pair
    assert_geometry_equal(ours, ref, geometry_case("boxes_and_points"), with_pos=False)


def test_geometry_encoder_at_real_sizes_equals_sam3():
    """sam3's own builder (width 256, 8 heads, FFN 2048, 3 layers, 7x7 RoI) against samfast's defaults."""
    from sam3.model_builder import _create_geometry_encoder

    torch.manual_seed(0)
    ours, ref = loaded_pair(_create_geometry_encoder(), SequenceGeometryEncoder())
    assert_geometry_equal(ours, ref, geometry_case("boxes_and_points"))


PLANTED_GEOMETRY = [
    ("points_pool_project.weight", "points"),
    ("points_pos_enc_project.bias", "points"),
    ("boxes_pool_project.weight", "boxes"),
    ("boxes_pos_enc_project.weight", "boxes"),
    ("img_pre_norm.weight", "boxes"),
    ("cls_embed.weight", "text_only"),
    ("encode.1.cross_attn_image.in_proj_weight", "text_only"),
    ("encode.0.self_attn.out_proj.weight", "boxes_and_points"),
    ("encode_norm.bias", "boxes_and_points"),
]


@pytest.mark.parametrize(("param", "name"), PLANTED_GEOMETRY)
def test_geometry_comparison_fails_on_a_perturbed_weight(geometry_pair, param, name):
    ours, ref = geometry_pair
    perturbed = SequenceGeometryEncoder(**SMALL).eval()
    perturbed.load_state_dict(ours.state_dict())
    perturb(perturbed.get_parameter(param))
    with pytest.raises(AssertionError):
        assert_geometry_equal(perturbed, ref, geometry_case(name))


def test_geometry_comparison_sees_negative_labels(geometry_pair):
    """Only the negative label's embedding perturbed: the cases with negatives fail, the all-positive one holds."""
    ours, ref = geometry_pair
    perturbed = SequenceGeometryEncoder(**SMALL).eval()
    perturbed.load_state_dict(ours.state_dict())
    perturb(perturbed.label_embed.weight[0])
    assert_geometry_equal(perturbed, ref, geometry_case("defaults"))
    with pytest.raises(AssertionError):
        assert_geometry_equal(perturbed, ref, geometry_case("boxes_and_points"))


def test_geometry_comparison_fails_without_the_padding_mask(geometry_pair):
    ours, ref = geometry_pair
    case = geometry_case("boxes_and_points")
    unpadded = {**case, "box_mask": torch.zeros_like(case["box_mask"]), "point_mask": torch.zeros_like(case["point_mask"])}
    with pytest.raises(AssertionError):
        assert_geometry_equal(ours, ref, case, ours_case=unpadded)


def test_geometry_comparison_fails_without_the_image_position(geometry_pair):
    ours, ref = geometry_pair
    feats, sizes, pos = image_levels(ref.d_model)
    ref_tokens, _ = run_reference_geometry(ref, geometry_case("points"), feats, sizes, pos)
    tokens, _ = run_geometry(ours, geometry_case("points"), feats, sizes, None)
    with pytest.raises(AssertionError):
        assert_close(tokens, ref_tokens)


# ---------------------------------------------------------------------------------------------------------
# the Prompt


def prompt_fields(prompt) -> list[torch.Tensor]:
    names = ["box_embeddings", "box_mask", "box_labels", "point_embeddings", "point_mask", "point_labels"]
    return [getattr(prompt, name) for name in names]


def assert_same_prompt(ours: Prompt, ref: Sam3Prompt) -> None:
    for field, ref_field in zip(prompt_fields(ours), prompt_fields(ref), strict=True):
        assert field.dtype == ref_field.dtype and torch.equal(field, ref_field)


def test_prompt_appends_as_sam3_does():
    """The image processor's path (a dummy prompt, then boxes with bool labels) and appends onto padded
    sequences, with and without a mask for the new entries."""
    g = torch.Generator().manual_seed(4)
    case = geometry_case("boxes_and_points")
    dummy = {"box_embeddings": torch.zeros(0, 1, 4), "box_mask": torch.zeros(1, 0, dtype=torch.bool)}
    ours, ref = Prompt(**dummy), Sam3Prompt(**dummy)
    for prompt in (ours, ref):
        prompt.append_boxes(torch.tensor([[[0.5, 0.4, 0.2, 0.3]]]), torch.tensor([[True]]))
        prompt.append_boxes(torch.tensor([[[0.3, 0.6, 0.1, 0.2]]]), torch.tensor([[False]]))
    assert_same_prompt(ours, ref)

    ours, ref = Prompt(**case), Sam3Prompt(**case)
    boxes, points = torch.rand(2, BATCH, 4, generator=g), torch.rand(3, BATCH, 2, generator=g)
    for prompt in (ours, ref):
        prompt.append_boxes(boxes, torch.tensor([[1, 0, 1], [0, 0, 1]]), right_padding([2, 0, 1], 2))
        prompt.append_points(points, torch.tensor([[0, 1, 1], [1, 1, 0], [1, 0, 0]]))
    assert_same_prompt(ours, ref)
    assert_same_prompt(ours.clone(), ref.clone())


def test_prompt_names_what_is_wrong():
    with pytest.raises(ValueError, match="batch size"):
        Prompt()
    with pytest.raises(ValueError, match=r"box mask of shape \(3, 2\), expected \(3, 3\)"):
        Prompt(box_embeddings=torch.zeros(3, 3, 4), box_mask=torch.zeros(3, 2, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------------------
# segmentation head


def sam3_segmentation_head(hidden_dim: int, num_heads: int) -> Sam3SegmentationHead:
    """sam3's head with the flags of sam3.model_builder._create_segmentation_head."""
    torch.manual_seed(0)
    return Sam3SegmentationHead(
        hidden_dim=hidden_dim, upsampling_stages=3, aux_masks=False, presence_head=False, dot_product_scorer=None,
        act_ckpt=True, cross_attend_prompt=MultiheadAttentionWrapper(num_heads=num_heads, dropout=0, embed_dim=hidden_dim),
        pixel_decoder=Sam3PixelDecoder(num_upsampling_stages=3, interpolation_mode="nearest", hidden_dim=hidden_dim),
    )


@pytest.fixture(scope="module")
def head_pair():
    return loaded_pair(sam3_segmentation_head(32, 4), UniversalSegmentationHead(32, 3, 4))


def head_inputs(hidden: int, n_images: int, sides: tuple[int, ...] = (16, 8, 4), seed: int = 5) -> dict:
    """Backbone levels (finest first) of n_images images, 3 prompts on them, 2 decoder layers of 5 queries,
    a prompt of 6 tokens per prompt with padding."""
    g = torch.Generator().manual_seed(seed)
    coarsest = sides[-1] ** 2
    return {
        "backbone_feats": [torch.randn(n_images, hidden, s, s, generator=g) for s in sides],
        "obj_queries": torch.randn(2, BATCH, 5, hidden, generator=g),
        "image_ids": torch.tensor([0, n_images - 1, n_images - 1]),
        "encoder_hidden_states": torch.randn(coarsest, BATCH, hidden, generator=g),
        "prompt": torch.randn(6, BATCH, hidden, generator=g),
        "prompt_mask": right_padding([6, 2, 4], 6),
    }


def assert_head_equal(ours, ref, inputs: dict, ours_inputs: dict | None = None) -> None:
    with torch.no_grad():
        ref_out = ref(**inputs)
        out = ours(**(ours_inputs or inputs))
    assert out.keys() == ref_out.keys()
    assert out["presence_logit"] is None and ref_out["presence_logit"] is None
    for key in ("pred_masks", "semantic_seg"):
        assert_close(out[key], ref_out[key])


@pytest.mark.parametrize("n_images", [1, 2])
def test_segmentation_head_equals_sam3(head_pair, n_images):
    """One image broadcast over the prompts, and two images each prompt picks from by image_ids."""
    ours, ref = head_pair
    inputs = head_inputs(32, n_images)
    assert_head_equal(ours, ref, inputs)
    with torch.no_grad():
        out = ours(**inputs)
    assert out["pred_masks"].shape == (BATCH, 5, 16, 16) and out["semantic_seg"].shape == (BATCH, 1, 16, 16)


def test_segmentation_head_with_four_levels_equals_sam3(head_pair):
    """Four levels: every upsampling stage runs (sam3's image model passes three, the third goes unused)."""
    ours, ref = head_pair
    assert_head_equal(ours, ref, head_inputs(32, 2, sides=(32, 16, 8, 4)))


def test_segmentation_head_at_real_sizes_equals_sam3():
    """sam3's own builder (hidden 256, 8 heads, 3 stages) on small maps."""
    from sam3.model_builder import _create_segmentation_head

    torch.manual_seed(0)
    ours, ref = loaded_pair(_create_segmentation_head(), UniversalSegmentationHead())
    assert_head_equal(ours, ref, head_inputs(256, 2, sides=(8, 4, 2)))


def test_pixel_decoder_refuses_more_levels_than_stages(head_pair):
    ours, _ = head_pair
    with pytest.raises(ValueError, match="num_upsampling_stages=4"):
        ours.pixel_decoder([torch.zeros(1, 32, s, s) for s in (32, 16, 8, 4, 2)])


PLANTED_HEAD = [
    "cross_attend_prompt.in_proj_weight",
    "cross_attn_norm.bias",
    "pixel_decoder.conv_layers.0.weight",
    "pixel_decoder.norms.1.weight",
    "instance_seg_head.weight",
    "semantic_seg_head.bias",
    "mask_predictor.mask_embed.layers.2.weight",
]


@pytest.mark.parametrize("param", PLANTED_HEAD)
def test_head_comparison_fails_on_a_perturbed_weight(head_pair, param):
    ours, ref = head_pair
    perturbed = UniversalSegmentationHead(32, 3, 4).eval()
    perturbed.load_state_dict(ours.state_dict())
    perturb(perturbed.get_parameter(param))
    with pytest.raises(AssertionError):
        assert_head_equal(perturbed, ref, head_inputs(32, 2))


def test_head_comparison_fails_without_the_prompt_mask(head_pair):
    ours, ref = head_pair
    inputs = head_inputs(32, 2)
    with pytest.raises(AssertionError):
        assert_head_equal(ours, ref, inputs, ours_inputs={**inputs, "prompt_mask": torch.zeros_like(inputs["prompt_mask"])})


# ---------------------------------------------------------------------------------------------------------
# written for speed: one graph, no host sync


class HostSyncs(TorchDispatchMode):
    """Records the aten ops of a call that make the host wait for the GPU: a scalar read back (.item(),
    .tolist(), bool(tensor)) or an output whose size depends on the data (nonzero, unique, indexing with
    a boolean mask). A device-to-host copy (.cpu()) cannot be seen on the CPU; these can."""

    READ_BACK = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
                 "is_nonzero", "equal"}

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.READ_BACK:
            self.found.append(name)
        if name in ("index", "index_put") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())
        ):
            self.found.append(f"{name} with a boolean mask")
        return func(*args, **(kwargs or {}))


def geometry_syncs(ours) -> list[str]:
    feats, sizes, pos = image_levels(SMALL["d_model"])
    prompt = Prompt(**geometry_case("boxes_and_points"))
    with torch.no_grad(), HostSyncs() as syncs:
        ours(prompt, feats, sizes, pos)
    return syncs.found


def test_geometry_encoder_and_head_have_no_host_sync(geometry_pair, head_pair):
    assert geometry_syncs(geometry_pair[0]) == []
    inputs = head_inputs(32, 2)
    with torch.no_grad(), HostSyncs() as syncs:
        head_pair[0](**inputs)
    assert syncs.found == []


def test_host_sync_check_finds_planted_syncs(geometry_pair, monkeypatch):
    from samfast.sam3 import geometry_encoder

    convert = geometry_encoder.box_cxcywh_to_xyxy
    monkeypatch.setattr(geometry_encoder, "box_cxcywh_to_xyxy", lambda boxes: convert(boxes) * boxes.max().item())
    assert geometry_syncs(geometry_pair[0]) == ["_local_scalar_dense"]
    monkeypatch.setattr(geometry_encoder, "box_cxcywh_to_xyxy", lambda boxes: convert(boxes[boxes[..., 0] >= 0]).view(boxes.shape))
    assert geometry_syncs(geometry_pair[0]) == ["index with a boolean mask"]


def trace_geometry(ours) -> None:
    """fullgraph dynamo tracing fails on a graph break: data-dependent control flow or shapes in forward."""
    torch._dynamo.reset()
    feats, sizes, pos = image_levels(SMALL["d_model"])
    with torch.no_grad():
        torch.compile(ours, backend="eager", fullgraph=True)(Prompt(**geometry_case("boxes_and_points")), feats, sizes, pos)


def test_geometry_encoder_traces_as_one_graph(geometry_pair):
    trace_geometry(geometry_pair[0])


def test_trace_fails_on_a_planted_graph_break(geometry_pair, monkeypatch):
    from samfast.sam3 import geometry_encoder

    convert = geometry_encoder.box_cxcywh_to_xyxy
    monkeypatch.setattr(geometry_encoder, "box_cxcywh_to_xyxy", lambda boxes: convert(boxes) if bool(boxes.sum() > 0) else boxes)
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        trace_geometry(geometry_pair[0])


def test_segmentation_head_traces_as_one_graph(head_pair):
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(head_pair[0], backend="eager", fullgraph=True)(**head_inputs(32, 2))
