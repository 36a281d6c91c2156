"""SAM 3's text side equals sam3 0.1.4's: the tokenizer (samfast.sam3.tokenizer, open_clip's BPE) and
the text encoder (samfast.sam3.text.TextEncoder vs sam3.model.text_encoder_ve.VETextEncoder).

The encoder is compared at a small size (width 64, 2 layers, 4 heads, the full 49408-token vocabulary
and the real context of 32, so sam3's own tokenizer path runs), every parameter seeded away from its
init (LayerNorm scales off 1, biases off 0) so that each one matters; one block is compared at the
real width (1024, 16 heads). Tolerances: the token embeddings are the same lookup (exact); the
features differ by the attention kernel only (sam3: nn.MultiheadAttention with an additive -inf mask;
samfast: SDPA with is_causal), fp32 rounding: measured max abs diff 0.0 at the small size, 1.05e-5 on
outputs up to 21 for the real-width block (inside rtol 1e-5).
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import torch

# through the harness, whose import of sam3 keeps TF32 as it was (sam3 turns it on at import with a GPU)
pytest.importorskip("tests.sam3_reference", reason="the SAM 3 reference package sam3==0.1.4 is not installed")
pytest.importorskip("open_clip", reason="SAM 3's tokenizer needs open_clip_torch")

from samfast.sam3.text import TextBlock, TextEncoder, fill_unset_text_parameters
from samfast.sam3.tokenizer import SAM3_CONTEXT_LENGTH, bpe_vocab_path, build_tokenizer

# The md5 of bpe_simple_vocab_16e6.txt.gz in sam3's source tree (assets/), which its wheel lacks.
SAM3_BPE_MD5 = "933b7abbbbde62c36f02f0e6ccde464f"
SOT, EOT = 49406, 49407

COCO_CATEGORIES = [
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard",
    "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase",
    "scissors", "teddy bear", "hair drier", "toothbrush",
]
LONG_PHRASE = (
    "a very long description of a scene with a red circle next to two blue squares and the triangle behind "
    "them, under a lamp, on a wooden table, beside a window that looks out on a garden full of flowers"
)
PHRASES = [
    "red circle", "blue squares", "the triangle", "a cat", "",
    "Hello, World!", "RED Circle", "  spaced   out\tphrase \n", "don't stop", "it's the dog's toy",
    "café crème brûlée", "Ünïcödé ΑΒΓ データ", "🍕 slice", "🐈‍⬛ black cat", "&amp; html &lt;tag&gt;",
    "3 apples and 12 pears", "x-ray; semi-colon: (parens) [brackets]",
    "!@!",  # BPE piece 0 ('!') inside a phrase: sam3 marks it as padding, a quirk to keep
    LONG_PHRASE,
] + COCO_CATEGORIES


@pytest.fixture(scope="module")
def sam3_tokenizer():
    """sam3's own tokenizer, reading open_clip's vocabulary (sam3's wheel ships none)."""
    from sam3.model.tokenizer_ve import SimpleTokenizer

    return SimpleTokenizer(bpe_path=str(bpe_vocab_path()))


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def assert_same_tokens(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    mismatched = (ours != ref).any(dim=1).nonzero().flatten().tolist()
    assert not mismatched, f"phrases {[PHRASES[i] for i in mismatched]} tokenize differently"


def test_bpe_vocab_is_the_one_in_sam3s_source_tree():
    assert hashlib.md5(bpe_vocab_path().read_bytes()).hexdigest() == SAM3_BPE_MD5


def test_tokens_equal_sam3s(tokenizer, sam3_tokenizer):
    # As VETextEncoder calls it: the context length passed on every call.
    ref = sam3_tokenizer(PHRASES, context_length=SAM3_CONTEXT_LENGTH)
    ours = tokenizer(PHRASES, context_length=SAM3_CONTEXT_LENGTH)
    assert_same_tokens(ours, ref)
    assert torch.equal(tokenizer(PHRASES), ours), "the default context length is not sam3's"
    # The cases the list is there for really occur: truncation, padding, an empty phrase.
    long = ours[PHRASES.index(LONG_PHRASE)]
    assert long[0] == SOT and long[-1] == EOT and (long != 0).all(), "the long phrase was not truncated"
    assert ours[PHRASES.index("")][:3].tolist() == [SOT, EOT, 0]
    assert ours[PHRASES.index("red circle")].tolist()[4:] == [0] * (SAM3_CONTEXT_LENGTH - 4)


def test_token_comparison_catches_a_planted_tokenizer_change(sam3_tokenizer):
    """Two plausible slips: keeping upper case, and cutting long phrases without ending them with EOT."""
    ref = sam3_tokenizer(PHRASES, context_length=SAM3_CONTEXT_LENGTH)
    from open_clip.tokenizer import SimpleTokenizer

    case_kept = SimpleTokenizer(bpe_path=str(bpe_vocab_path()), context_length=SAM3_CONTEXT_LENGTH, clean="whitespace")
    with pytest.raises(AssertionError, match="RED Circle"):
        assert_same_tokens(case_kept(PHRASES), ref)
    cut_without_eot = build_tokenizer(context_length=SAM3_CONTEXT_LENGTH + 1)(PHRASES)[:, :SAM3_CONTEXT_LENGTH]
    with pytest.raises(AssertionError, match="a very long description"):
        assert_same_tokens(cut_without_eot, ref)


def move_off_init(module: torch.nn.Module) -> None:
    """Every parameter moved off its init (seeded by the caller), so that each one matters."""
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn_like(param), alpha=0.05)


SMALL = dict(d_model=32, width=64, heads=4, layers=2)


@pytest.fixture(scope="module")
def encoders(sam3_tokenizer, tokenizer):
    """(samfast's TextEncoder, sam3's VETextEncoder) at SMALL sizes with the same seeded weights."""
    from sam3.model.text_encoder_ve import VETextEncoder

    torch.manual_seed(0)
    ref = VETextEncoder(tokenizer=sam3_tokenizer, **SMALL).eval()
    fill_unset_text_parameters(ref)  # sam3 leaves them torch.empty
    move_off_init(ref)
    ours = TextEncoder(tokenizer=tokenizer, **SMALL).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


def assert_same_encoding(ours, ref) -> None:
    mask, features, embeds = ours
    ref_mask, ref_features, ref_embeds = ref
    assert torch.equal(mask, ref_mask) and mask.dtype == torch.bool
    assert features.shape == ref_features.shape and embeds.shape == ref_embeds.shape
    assert features.is_contiguous() == ref_features.is_contiguous()
    torch.testing.assert_close(embeds, ref_embeds, rtol=0, atol=0)
    torch.testing.assert_close(features, ref_features, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_encoder_equals_sam3s(encoders):
    ours, ref = encoders
    expected = ref(PHRASES, device="cpu")
    got = ours(PHRASES)
    assert_same_encoding(got, expected)
    mask, features, embeds = got
    assert features.shape == (SAM3_CONTEXT_LENGTH, len(PHRASES), SMALL["d_model"])
    assert embeds.shape == (SAM3_CONTEXT_LENGTH, len(PHRASES), SMALL["width"])
    assert mask[PHRASES.index("red circle")].tolist() == [False] * 4 + [True] * (SAM3_CONTEXT_LENGTH - 4)


@torch.no_grad()
def test_text_transformer_equals_sam3s_on_sequences_shorter_than_the_context(encoders, tokenizer):
    """sam3 slices its positions and its causal mask to the tokens' length; SDPA's is_causal is that slice."""
    ours, ref = encoders
    tokens = tokenizer(PHRASES)[:, :9]
    embeds, features = ours.encoder(tokens)
    _, ref_tokens = ref.encoder(tokens)  # the first output, tokens @ text_projection, sam3 discards
    torch.testing.assert_close(embeds, ref.encoder.token_embedding(tokens), rtol=0, atol=0)
    torch.testing.assert_close(features, ref_tokens, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_encoder_comparison_catches_planted_defects(encoders):
    """A perturbed attention weight in the last block, and the positional embedding dropped."""
    ours, ref = encoders
    expected = ref(PHRASES, device="cpu")
    weight = ours.encoder.transformer.resblocks[-1].attn.in_proj_weight
    nudged = weight.clone()
    nudged[0, 0] += 1e-2
    positions = ours.encoder.positional_embedding
    for param, planted in ((weight, nudged), (positions, torch.zeros_like(positions))):
        kept = param.clone()
        param.copy_(planted)
        try:
            with pytest.raises(AssertionError):
                assert_same_encoding(ours(PHRASES), expected)
        finally:
            param.copy_(kept)
    assert_same_encoding(ours(PHRASES), expected)


@torch.no_grad()
def test_encode_compiles_to_one_graph_without_breaks(encoders, tokenizer):
    """The tensor part traces whole (no host syncs, no data-dependent shapes): one graph for every batch
    of the same size (dynamo only; inductor's CPU codegen would cost this suite tens of seconds)."""
    from parity.checks.compile import watch

    ours, _ = encoders
    torch._dynamo.reset()
    compiled = torch.compile(ours.encode, backend="eager", fullgraph=True, dynamic=False)
    batches = [tokenizer(PHRASES[i : i + 4]) for i in (0, 4, 8)]
    with watch() as seen:
        outputs = [compiled(tokens) for tokens in batches]
    torch._dynamo.reset()
    seen.assert_clean()
    assert seen.graphs_compiled == 1
    for got, tokens in zip(outputs, batches):
        for out, expected in zip(got, ours.encode(tokens)):
            assert torch.equal(out, expected)


def test_state_dict_layout_equals_sam3s_at_real_size(sam3_tokenizer, tokenizer):
    """sam3's model_builder sizes (d_model 256, width 1024, 16 heads, 24 layers), on the meta device."""
    from sam3.model.text_encoder_ve import VETextEncoder

    real = dict(d_model=256, width=1024, heads=16, layers=24)
    with torch.device("meta"):
        ref = VETextEncoder(tokenizer=sam3_tokenizer, **real)
        ours = TextEncoder(tokenizer=tokenizer, **real)
    ref_shapes = {k: v.shape for k, v in ref.state_dict().items()}
    assert {k: v.shape for k, v in ours.state_dict().items()} == ref_shapes
    assert ref_shapes["encoder.text_projection"] == (1024, 512)
    assert ref_shapes["encoder.positional_embedding"] == (SAM3_CONTEXT_LENGTH, 1024)


@torch.no_grad()
def test_one_block_equals_sam3s_at_real_width():
    from sam3.model.text_encoder_ve import ResidualAttentionBlock, TextTransformer

    torch.manual_seed(1)
    ref = ResidualAttentionBlock(1024, 16).eval()
    move_off_init(ref)
    ours = TextBlock(1024, 16).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, SAM3_CONTEXT_LENGTH, 1024)
    causal = TextTransformer.build_causal_mask(SimpleNamespace(num_pos=SAM3_CONTEXT_LENGTH))
    expected = ref(x, attn_mask=causal)
    torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)
    ours.mlp.c_proj.bias[0] += 1e-3
    with pytest.raises(AssertionError):
        torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)


def test_seeded_fill_is_reproducible_and_replaces_empty_memory(tokenizer):
    first, second = (TextEncoder(32, tokenizer, width=16, heads=2, layers=1) for _ in range(2))
    for module in (first, second):
        torch.manual_seed(3)
        fill_unset_text_parameters(module)
    assert torch.equal(first.encoder.positional_embedding, second.encoder.positional_embedding)
    assert torch.equal(first.encoder.text_projection, second.encoder.text_projection)
    std = first.encoder.text_projection.std().item()
    assert 0.5 * 16**-0.5 < std < 1.5 * 16**-0.5, std
