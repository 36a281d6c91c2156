"""SAM 3's detector transformer (fusion encoder, DETR decoder, dot-product scoring) equals sam3 0.1.4 in fp32.

Each sam3 module is built as sam3.model_builder builds it, at small sizes (2 layers, d_model 64,
4 heads, FFN 128, 10 queries, a 4 x 6 feature map so that rows and columns cannot be swapped
unseen, 5 prompt tokens with padding) and once at the real sizes for one layer; every parameter
seeded (tests/sam3_modules.py), loaded strictly into samfast's module, the same inputs fed to both.

Tolerance: samfast runs the attentions through SDPA where sam3's plain nn.MultiheadAttention
writes the softmax out, and hoists sums out of the layer loop; that reorders fp32 arithmetic only
(measured max abs diff: encoder 0.0, decoder 1.3e-6 on states of magnitude 3.6), hence
rtol = atol = 1e-5. The planted-defect
tests show the same comparison fails on a perturbed weight, a dropped term and a wrong layout.
Each module also traces under dynamo as one graph (no host sync): a planted .item() breaks it.
"""

from __future__ import annotations

import pytest
import torch

# through the harness, whose import of sam3 keeps TF32 as it was (sam3 turns it on at import with a GPU)
pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")

from samfast.sam3.detr_decoder import DetrDecoder, DetrDecoderLayer
from samfast.sam3.fusion_encoder import FusionEncoder, FusionEncoderLayer
from samfast.sam3.multihead_attention import padding_bias
from samfast.sam3.scoring import DotProductScoring
from tests.sam3_modules import (
    sam3_detr_decoder,
    sam3_detr_decoder_layer,
    sam3_dot_product_scoring,
    sam3_fusion_encoder,
    sam3_fusion_encoder_layer,
    seed_detector_weights,
)

SMALL = dict(d_model=64, num_heads=4, dim_feedforward=128)
REAL = dict(d_model=256, num_heads=8, dim_feedforward=2048)
FEAT_SIZE = (4, 6)
BATCH, TOKENS, QUERIES, LAYERS = 2, 5, 10, 2
TOL = dict(rtol=1e-5, atol=1e-5)
NO_PADDING = torch.zeros(BATCH, TOKENS, dtype=torch.bool)


def assert_equal(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    torch.testing.assert_close(ours, ref, **TOL)


def assert_differs(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """The planted defect shows: the comparison assert_equal makes fails."""
    with pytest.raises(AssertionError):
        assert_equal(ours, ref)


def loaded(ours: torch.nn.Module, ref: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    seed_detector_weights(ref, seed)
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours.eval()


def tokens(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def prompt_padding(batch: int = BATCH, length: int = TOKENS) -> torch.Tensor:
    """(B, S), True on padding: prompt b has length - b valid tokens (at least one)."""
    return torch.arange(length)[None, :] >= (length - torch.arange(batch))[:, None].clamp(min=1)


@pytest.fixture(scope="module")
def encoder_inputs():
    hw, c = FEAT_SIZE[0] * FEAT_SIZE[1], SMALL["d_model"]
    return dict(
        src=tokens(hw, BATCH, c, seed=1),
        src_pos=tokens(hw, BATCH, c, seed=2),
        prompt=tokens(TOKENS, BATCH, c, seed=3),
        prompt_key_padding_mask=prompt_padding(),
    )


def sam3_encode(ref, src, src_pos, prompt, prompt_key_padding_mask):
    """As Sam3Image._run_encoder calls its encoder (fresh lists: sam3 rewrites their entries)."""
    with torch.no_grad():
        return ref(
            src=[src.clone()],
            src_key_padding_mask=None,
            src_pos=[src_pos.clone()],
            prompt=prompt,
            prompt_pos=torch.zeros_like(prompt),
            prompt_key_padding_mask=prompt_key_padding_mask,
            feat_sizes=[FEAT_SIZE],
        )


@pytest.fixture(scope="module")
def encoders():
    ref = sam3_fusion_encoder(num_layers=LAYERS, **SMALL)
    return loaded(FusionEncoder(num_layers=LAYERS, **SMALL), ref), ref


def test_fusion_encoder_equals_sam3(encoders, encoder_inputs):
    ours, ref = encoders
    expected = sam3_encode(ref, **encoder_inputs)
    with torch.no_grad():
        memory = ours(**encoder_inputs)
    assert_equal(memory, expected["memory"])
    # what samfast's encoder does not return, sam3's passes through unchanged
    assert torch.equal(expected["pos_embed"], encoder_inputs["src_pos"])
    assert expected["memory_text"] is encoder_inputs["prompt"] and expected["padding_mask"] is None


def test_fusion_encoder_planted_defects_fail(encoders, encoder_inputs):
    ours, ref = encoders
    expected = sam3_encode(ref, **encoder_inputs)["memory"]
    with torch.no_grad():
        ignoring_padding = ours(**{**encoder_inputs, "prompt_key_padding_mask": NO_PADDING})
        assert_differs(ignoring_padding, expected)
        no_positions = ours(**{**encoder_inputs, "src_pos": torch.zeros_like(encoder_inputs["src_pos"])})
        assert_differs(no_positions, expected)
        perturbed = FusionEncoder(num_layers=LAYERS, **SMALL).eval()
        perturbed.load_state_dict(ours.state_dict(), strict=True)
        perturbed.layers[-1].cross_attn_image.in_proj_weight[-1, 0] += 1e-3  # a value projection's weight
        assert_differs(perturbed(**encoder_inputs), expected)


def encoder_layer_inputs(d_model: int, length: int, prompt_length: int):
    return dict(
        x=tokens(BATCH, length, d_model, seed=4),
        pos=tokens(BATCH, length, d_model, seed=5),
        memory=tokens(BATCH, prompt_length, d_model, seed=6),
        memory_pos=tokens(BATCH, prompt_length, d_model, seed=7),
        padding=prompt_padding(BATCH, prompt_length),
    )


def test_fusion_encoder_layer_at_real_size_equals_sam3():
    ref = sam3_fusion_encoder_layer(**REAL)
    ours = loaded(FusionEncoderLayer(REAL["d_model"], REAL["num_heads"], REAL["dim_feedforward"]), ref)
    i = encoder_layer_inputs(REAL["d_model"], length=64, prompt_length=8)
    with torch.no_grad():
        expected = ref(tgt=i["x"], memory=i["memory"], query_pos=i["pos"], memory_key_padding_mask=i["padding"])
        out = ours(i["x"], i["pos"], i["memory"], padding_bias(i["padding"], torch.float32))
        assert_equal(out, expected)
        ours.linear2.bias[0] += 1e-3
        assert_differs(ours(i["x"], i["pos"], i["memory"], padding_bias(i["padding"], torch.float32)), expected)


def test_encoder_layer_with_the_geometry_encoders_flags_equals_sam3():
    """sam3's geometry encoder builds the same layer seq-first, with the prompt's positions on the
    cross-attention keys and none on the self-attention; samfast's layer takes those flags."""
    ref = sam3_fusion_encoder_layer(**SMALL, pos_enc_at_attn=False, pos_enc_at_cross_attn_keys=True, batch_first=False)
    ours = loaded(
        FusionEncoderLayer(
            SMALL["d_model"],
            SMALL["num_heads"],
            SMALL["dim_feedforward"],
            pos_enc_at_attn=False,
            pos_enc_at_cross_attn_keys=True,
        ),
        ref,
    )
    i = encoder_layer_inputs(SMALL["d_model"], length=7, prompt_length=TOKENS)
    bias = padding_bias(i["padding"], torch.float32)
    with torch.no_grad():
        seq_first = {k: i[k].transpose(0, 1) for k in ("x", "pos", "memory", "memory_pos")}
        expected = ref(
            tgt=seq_first["x"],
            memory=seq_first["memory"],
            query_pos=seq_first["pos"],
            pos=seq_first["memory_pos"],
            memory_key_padding_mask=i["padding"],
        ).transpose(0, 1)
        out = ours(i["x"], i["pos"], i["memory"], bias, i["memory_pos"])
        assert_equal(out, expected)
        dropped_key_positions = ours(i["x"], i["pos"], i["memory"], bias, torch.zeros_like(i["memory_pos"]))
        assert_differs(dropped_key_positions, expected)


@pytest.fixture(scope="module")
def decoder_inputs():
    hw, c = FEAT_SIZE[0] * FEAT_SIZE[1], SMALL["d_model"]
    return dict(
        memory=tokens(hw, BATCH, c, seed=8),
        pos=tokens(hw, BATCH, c, seed=9),
        memory_text=tokens(TOKENS, BATCH, c, seed=10),
        text_attention_mask=prompt_padding(),
        feat_size=FEAT_SIZE,
    )


def sam3_decode(ref, memory, pos, memory_text, text_attention_mask, feat_size):
    """As Sam3Image._run_decoder calls its decoder in eval mode (one feature level, no padding)."""
    batch = memory.shape[1]
    with torch.no_grad():
        return ref(
            tgt=ref.query_embed.weight.unsqueeze(1).repeat(1, batch, 1),
            memory=memory,
            memory_key_padding_mask=None,
            pos=pos,
            reference_boxes=None,
            level_start_index=torch.zeros(1, dtype=torch.long),
            spatial_shapes=torch.tensor([feat_size]),
            valid_ratios=torch.ones(batch, 1, 2),
            tgt_mask=None,
            memory_text=memory_text,
            text_attention_mask=text_attention_mask,
            apply_dac=False,
        )


@pytest.fixture(scope="module")
def decoders():
    ref = sam3_detr_decoder(num_layers=LAYERS, num_queries=QUERIES, **SMALL)
    return loaded(DetrDecoder(num_layers=LAYERS, num_queries=QUERIES, **SMALL), ref), ref


def test_detr_decoder_equals_sam3(decoders, decoder_inputs):
    ours, ref = decoders
    expected = sam3_decode(ref, **decoder_inputs)
    with torch.no_grad():
        outputs = ours(**decoder_inputs)
    hidden, boxes, presence_logits, presence_feats = outputs
    assert hidden.shape == (LAYERS, QUERIES, BATCH, SMALL["d_model"])
    assert boxes.shape == (LAYERS, QUERIES, BATCH, 4)
    assert presence_logits.shape == (LAYERS, 1, BATCH)
    assert presence_feats.shape == (1, BATCH, SMALL["d_model"])
    for out, ref_out in zip(outputs, expected, strict=True):
        assert_equal(out, ref_out)
    # the refined boxes moved away from the embeddings' (a box head that left them still would not test it)
    assert not torch.allclose(boxes[1], boxes[0], atol=1e-3)


def no_box_bias(decoder: DetrDecoder, boxes: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
    return boxes.new_zeros(boxes.shape[0], decoder.num_heads, boxes.shape[1], feat_size[0] * feat_size[1])


def test_detr_decoder_planted_defects_fail(decoders, decoder_inputs, monkeypatch):
    ours, ref = decoders
    hidden, _, presence_logits, _ = sam3_decode(ref, **decoder_inputs)
    with torch.no_grad():
        transposed_grid = ours(**{**decoder_inputs, "feat_size": FEAT_SIZE[::-1]})
        assert_differs(transposed_grid[0], hidden)
        ignoring_padding = ours(**{**decoder_inputs, "text_attention_mask": NO_PADDING})
        assert_differs(ignoring_padding[2], presence_logits)
        perturbed = DetrDecoder(num_layers=LAYERS, num_queries=QUERIES, **SMALL).eval()
        perturbed.load_state_dict(ours.state_dict(), strict=True)
        perturbed.boxRPB_embed_y.layers[0].weight[0, 0] += 1e-3
        assert_differs(perturbed(**decoder_inputs)[0], hidden)
        monkeypatch.setattr(DetrDecoder, "box_bias", no_box_bias)
        assert_differs(ours(**decoder_inputs)[0], hidden)


def test_detr_decoder_layer_at_real_size_equals_sam3():
    d, heads = REAL["d_model"], REAL["num_heads"]
    ref = sam3_detr_decoder_layer(**REAL)
    ours = loaded(DetrDecoderLayer(d, heads, REAL["dim_feedforward"]), ref)
    queries, hw, length = 12, 24, 6
    tgt, query_pos = tokens(queries, BATCH, d, seed=11), tokens(queries, BATCH, d, seed=12)
    presence = tokens(1, BATCH, d, seed=13)
    text, text_padding = tokens(length, BATCH, d, seed=14), prompt_padding(BATCH, length)
    image, image_pos = tokens(hw, BATCH, d, seed=15), tokens(hw, BATCH, d, seed=16)
    box_bias = tokens(BATCH, heads, queries, hw, seed=17)
    with torch.no_grad():
        expected, expected_presence = ref(
            tgt=tgt,
            tgt_query_pos=query_pos,
            memory_text=text,
            text_attention_mask=text_padding,
            memory=image,
            memory_pos=image_pos,
            cross_attn_mask=box_bias.flatten(0, 1),
            presence_token=presence,
        )
        inputs = (
            torch.cat((presence, tgt)).transpose(0, 1),
            torch.cat((torch.zeros_like(presence), query_pos)).transpose(0, 1),
            text.transpose(0, 1),
            padding_bias(text_padding, torch.float32),
            (image + image_pos).transpose(0, 1),
            image.transpose(0, 1),
            torch.nn.functional.pad(box_bias, (0, 0, 1, 0)),
        )
        out = ours(*inputs).transpose(0, 1)
        assert_equal(out[1:], expected)
        assert_equal(out[:1], expected_presence)
        ours.catext_norm.weight[0] += 1e-3
        assert_differs(ours(*inputs).transpose(0, 1)[1:], expected)


@pytest.mark.parametrize(
    "sizes", [dict(d_model=64, mlp_dim=128), dict(d_model=256, mlp_dim=2048)], ids=["small", "real"]
)
def test_dot_product_scoring_equals_sam3(sizes):
    ref = sam3_dot_product_scoring(**sizes)
    ours = loaded(DotProductScoring(d_model=sizes["d_model"], d_proj=sizes["d_model"], mlp_dim=sizes["mlp_dim"]), ref)
    # hs scaled up so that some logits pass sam3's clamp at 12
    hs = 40 * tokens(LAYERS, BATCH, QUERIES, sizes["d_model"], seed=18)
    prompt, padding = tokens(TOKENS, BATCH, sizes["d_model"], seed=19), prompt_padding()
    with torch.no_grad():
        expected = ref(hs, prompt, padding)
        scores = ours(hs, prompt, padding)
        assert_equal(scores, expected)
        assert (expected.abs() == 12.0).any() and (expected.abs() < 12.0).any()
        assert_differs(ours(hs, prompt, torch.zeros_like(padding)), expected)  # padding pooled in
        ours.prompt_mlp.out_norm.bias[0] += 1e-2
        assert_differs(ours(hs, prompt, padding), expected)


def test_state_dicts_at_real_sizes_have_sam3s_keys_and_shapes():
    """The image model's configuration (model_builder's 6 layers, 256 wide, 8 heads, FFN 2048, 200 queries),
    built on the meta device: a real sam3.pt's detector.transformer.* and dot_prod_scoring.* load strictly."""
    with torch.device("meta"):
        pairs = [
            (FusionEncoder(), sam3_fusion_encoder(num_layers=6, **REAL)),
            (DetrDecoder(), sam3_detr_decoder(num_layers=6, num_queries=200, **REAL)),
            (DotProductScoring(), sam3_dot_product_scoring(d_model=256, mlp_dim=2048)),
        ]
    for ours, ref in pairs:
        ours_shapes = {k: v.shape for k, v in ours.state_dict().items()}
        assert ours_shapes == {k: v.shape for k, v in ref.state_dict().items()}


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def traced_cleanly(module: torch.nn.Module, *inputs) -> None:
    """module traced by dynamo (eager backend: the graph capture without inductor's CPU codegen) as one
    graph with no break and no recompile: no host sync, no data-dependent Python, for the compile switch."""
    from parity.checks.compile import watch

    torch._dynamo.reset()
    compiled = torch.compile(module, backend="eager")
    with torch.no_grad(), watch() as seen:
        out = compiled(*inputs)
    seen.assert_clean()
    assert seen.graphs_compiled == 1
    with torch.no_grad():
        expected = module(*inputs)
    for a, b in zip(as_tuple(out), as_tuple(expected), strict=True):
        assert torch.equal(a, b)


def test_fusion_encoder_traces_as_one_graph(encoders, encoder_inputs):
    traced_cleanly(encoders[0], *encoder_inputs.values())


def test_detr_decoder_traces_as_one_graph(decoders, decoder_inputs):
    traced_cleanly(decoders[0], *decoder_inputs.values())


def test_scoring_traces_as_one_graph_and_a_planted_sync_breaks_it(monkeypatch):
    scoring = DotProductScoring(d_model=64, d_proj=64, mlp_dim=128).eval()
    inputs = (tokens(LAYERS, BATCH, QUERIES, 64, seed=20), tokens(TOKENS, BATCH, 64, seed=21), prompt_padding())
    traced_cleanly(scoring, *inputs)
    forward = DotProductScoring.forward
    monkeypatch.setattr(DotProductScoring, "forward", lambda self, *a: forward(self, *a) * a[1].abs().max().item())
    with pytest.raises(AssertionError, match="graph break"):
        traced_cleanly(scoring, *inputs)
