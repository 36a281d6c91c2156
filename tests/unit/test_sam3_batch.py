"""SAM 3's batched prompts and cached phrase encodings (samfast.sam3.processor, samfast.sam3.text_cache)
equal the one-image, one-phrase path they speed up, in fp32 on the CPU.

The slow path is set_image + set_text_prompt per (image, phrase) with no phrase cache, itself equal to
sam3 0.1.4's processor (test_sam3_image_model.py). The batch stacks images, phrases and pairs where the
loop runs one at a time: that reorders fp32 arithmetic only, so rtol = atol = 1e-5. The threshold sits
between two of the loop's scores far from any other, so pairs keep different numbers of instances and
fp32 noise cannot move one across it. Planted defects: phrase features paired with the wrong image's
prompt, an extra host sync, and a cache that misses a weight change each fail their check.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("open_clip", reason="SAM 3's tokenizer needs open_clip_torch")

import samfast  # noqa: E402
from samfast.sam3 import Sam3Processor  # noqa: E402
from samfast.sam3.config import SAM3_REDUCED  # noqa: E402
from samfast.sam3.text_cache import PhraseEncodings  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)
RESULT_KEYS = ("masks_logits", "boxes", "scores")
# (width, height): three sizes, none square but the last, none the model's
SIZES = [(150, 90), (64, 80), (112, 112)]
PHRASE_SETS = {
    "one": ["a red circle"],
    "two": ["a red circle", "blue squares"],
    "four, one repeated": ["a red circle", "blue squares", "x", "a red circle"],
}


@pytest.fixture(scope="module")
def model():
    return samfast.build_sam("sam3_reduced", seed=0, device="cpu")


def pil_images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in SIZES]


def processor(model, threshold: float = 0.0, cache: int = 256) -> Sam3Processor:
    return Sam3Processor(model, resolution=SAM3_REDUCED.image_size, device="cpu", confidence_threshold=threshold,
                         text_cache_size=cache)


def looped(model, images, phrases, threshold: float) -> list[list[dict]]:
    """The slow path: each image set, each phrase prompted, no cache; the results copied out of the state."""
    slow = processor(model, threshold, cache=0)
    results = []
    for image in images:
        state = slow.set_image(image)
        results.append([dict(slow.set_text_prompt(phrase, state)) for phrase in phrases])
    return results


def threshold_between_scores(results: list[list[dict]]) -> float:
    """The midpoint of the widest gap between two scores in the middle half of all scores."""
    scores = torch.cat([r["scores"] for row in results for r in row]).unique().sort().values
    middle = scores[len(scores) // 4 : 3 * len(scores) // 4 + 1]
    gap = middle.diff().argmax()
    assert middle[gap + 1] - middle[gap] > 1e-4, "no clear gap between scores to put the threshold in"
    return ((middle[gap] + middle[gap + 1]) / 2).item()


def assert_results_equal(got: list[list[dict]], ref: list[list[dict]]) -> None:
    assert len(got) == len(ref) and all(len(g) == len(r) for g, r in zip(got, ref))
    for i, (got_row, ref_row) in enumerate(zip(got, ref)):
        for j, (g, r) in enumerate(zip(got_row, ref_row)):
            where = f"image {i}, phrase {j}"
            assert (g["original_height"], g["original_width"]) == (r["original_height"], r["original_width"]), where
            for key in RESULT_KEYS:
                assert g[key].shape == r[key].shape and g[key].dtype == r[key].dtype, f"{where}: {key}"
                torch.testing.assert_close(g[key], r[key], **TOL, msg=lambda m: f"{where}: {key}: {m}")
            assert g["masks"].dtype == torch.bool
            # a mask probability within fp32 noise of 0.5 may round either way
            near_half = (r["masks_logits"] - 0.5).abs() < 1e-5
            assert torch.equal(g["masks"] | near_half, r["masks"] | near_half), where


@pytest.fixture(scope="module")
def loops(model):
    """Per phrase set: the threshold and the slow path's results at it."""
    images, found = pil_images(), {}
    for name, phrases in PHRASE_SETS.items():
        threshold = threshold_between_scores(looped(model, images, phrases, threshold=0.0))
        found[name] = threshold, looped(model, images, phrases, threshold)
    return found


@pytest.mark.parametrize("name", PHRASE_SETS)
def test_batch_equals_the_loop_over_pairs(model, loops, name):
    threshold, ref = loops[name]
    phrases = PHRASE_SETS[name]
    got = processor(model, threshold).predict_batch(pil_images(), phrases)
    assert_results_equal(got, ref)
    kept = [len(r["scores"]) for row in ref for r in row]
    # the threshold decides per pair: some pairs keep more than others
    assert min(kept) < SAM3_REDUCED.num_queries and len(set(kept)) > 1
    assert [r["masks"].shape[-2:] for r in got[0]] == [(90, 150)] * len(phrases)
    if name == "four, one repeated":
        for row in got:  # the same pair twice in one call: equal up to the BLAS's row blocking (thread counts)
            torch.testing.assert_close(row[3]["scores"], row[0]["scores"], rtol=0, atol=1e-6)


def test_phrases_paired_with_the_next_phrases_features_fail(model, loops):
    threshold, ref = loops["two"]
    fast = processor(model, threshold)
    grounding = model.forward_grounding

    def shifted(backbone_out, find_input, geometric_prompt):
        find_input.text_ids = (find_input.text_ids + 1) % len(PHRASE_SETS["two"])
        return grounding(backbone_out=backbone_out, find_input=find_input, geometric_prompt=geometric_prompt)

    with mock.patch.object(model, "forward_grounding", shifted):
        got = fast.predict_batch(pil_images(), PHRASE_SETS["two"])
    with pytest.raises(AssertionError):
        assert_results_equal(got, ref)


def test_batch_refuses_what_it_cannot_pair(model):
    fast = processor(model)
    with pytest.raises(ValueError, match="list of strings"):
        fast.predict_batch(pil_images(), "a red circle")
    with pytest.raises(ValueError, match="non-empty list of images"):
        fast.predict_batch([], ["a red circle"])
    with pytest.raises(ValueError, match=r"images\[1\] is a str"):
        fast.predict_batch([pil_images()[0], "cat.jpg"], ["a red circle"])


# ---------------------------------------------------------------------------------------------------
# host syncs: one per pair, after the model


def batch_syncs(fast: Sam3Processor, phrases: list[str]) -> list[str]:
    pytest.importorskip("tests.sam3_reference", reason="the host-sync recorder's module needs sam3==0.1.4")
    from tests.unit.test_sam3_geometry_and_masks import HostSyncs

    images = pil_images()
    with HostSyncs() as syncs:
        fast.predict_batch(images, phrases)
    return syncs.found


def test_batch_makes_one_host_sync_per_pair(model):
    fast = processor(model, threshold=0.3)
    assert batch_syncs(fast, PHRASE_SETS["two"]) == ["nonzero"] * (len(SIZES) * 2)


def test_a_planted_sync_changes_the_count(model):
    fast = processor(model, threshold=0.3)
    encode_image = model.backbone.forward_image

    def with_a_read_back(images):
        # bool(tensor), not .item(): under inference_mode the recorder does not see a CPU tensor's .item()
        bool(images.sum() > 0)
        return encode_image(images)

    with mock.patch.object(model.backbone, "forward_image", with_a_read_back):
        found = batch_syncs(fast, PHRASE_SETS["two"])
    assert found == ["is_nonzero"] + ["nonzero"] * (len(SIZES) * 2)


# ---------------------------------------------------------------------------------------------------
# phrase encodings cached


class TextEncoderCalls:
    """The phrases of each call of the text encoder, through a forward hook."""

    def __init__(self, model) -> None:
        self.calls: list[list[str]] = []
        self.handle = model.backbone.language_backbone.register_forward_hook(
            lambda module, args, output: self.calls.append(list(args[0]))
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def test_cached_encodings_give_the_uncached_outputs(model, loops):
    threshold, ref = loops["four, one repeated"]
    cached = processor(model, threshold)
    images, phrases = pil_images(), PHRASE_SETS["four, one repeated"]
    # phrases encoded one by one in set_text_prompt, then reused from the cache in a batch of four
    for image, ref_row in zip(images, ref):
        state = cached.set_image(image)
        assert_results_equal([[dict(cached.set_text_prompt(phrase, state)) for phrase in phrases]], [ref_row])
    assert len(cached.phrase_encodings) == 3
    assert_results_equal(cached.predict_batch(images, phrases), ref)
    # and the other way round: encoded in a batch, then reused one by one
    batched_first = processor(model, threshold)
    batched_first.predict_batch(images, phrases)
    state = batched_first.set_image(images[1])
    assert_results_equal([[dict(batched_first.set_text_prompt(p, state)) for p in phrases]], [ref[1]])


def test_a_phrase_asked_of_three_images_is_encoded_once(model):
    images = pil_images()
    with TextEncoderCalls(model) as encoder:
        cached = processor(model)
        for image in images:
            cached.set_text_prompt("a red circle", cached.set_image(image))
        assert encoder.calls == [["a red circle"]]
        # the batch encodes only what is new, each distinct phrase once, in one call
        cached.predict_batch(images, ["a red circle", "x", "blue squares", "x"])
        assert encoder.calls == [["a red circle"], ["x", "blue squares"]]
        cached.predict_batch(images, ["x", "a red circle"])
        assert len(encoder.calls) == 2
    with TextEncoderCalls(model) as encoder:
        uncached = processor(model, cache=0)
        for image in images:
            uncached.set_text_prompt("a red circle", uncached.set_image(image))
        assert encoder.calls == [["a red circle"]] * 3


def test_the_cache_keeps_the_most_recently_used_phrases(model):
    with TextEncoderCalls(model) as encoder:
        encodings = PhraseEncodings(model.backbone, max_phrases=2)
        encodings.encode(["a", "b"])
        encodings.encode(["a"])  # "a" used last: "b" goes first
        encodings.encode(["c"])
        assert len(encodings) == 2 and "a" in encodings and "c" in encodings and "b" not in encodings
        encodings.encode(["a", "c"])
        assert encoder.calls == [["a", "b"], ["c"]]
    with pytest.raises(ValueError, match="phrases to keep"):
        PhraseEncodings(model.backbone, max_phrases=-1)


def check_the_cache_follows_the_weights(how: str) -> None:
    """A processor's cached phrase, then new text-encoder weights (by `how`): the phrase's results are the
    new weights' (those of a processor that never cached it) and differ from the old ones."""
    model = samfast.build_sam("sam3_reduced", seed=0, device="cpu")
    image, phrase = pil_images()[0], "a red circle"
    cached = processor(model)
    before = dict(cached.set_text_prompt(phrase, cached.set_image(image)))
    other = samfast.build_sam("sam3_reduced", seed=1, device="cpu").state_dict()
    text_weights = {k: v for k, v in other.items() if k.startswith("backbone.language_backbone.")}
    if how == "load_state_dict":
        model.load_state_dict({**model.state_dict(), **text_weights}, strict=True)
    elif how == "in place":
        with torch.no_grad():
            model.backbone.language_backbone.resizer.weight.mul_(1.5)
    else:
        model.load_state_dict({**model.state_dict(), **text_weights}, strict=True, assign=True)
    after = dict(cached.set_text_prompt(phrase, cached.set_image(image)))
    fresh = processor(model, cache=0)
    expected = dict(fresh.set_text_prompt(phrase, fresh.set_image(image)))
    assert not torch.allclose(before["scores"], expected["scores"], **TOL)
    assert_results_equal([[after]], [[expected]])


@pytest.mark.parametrize("how", ["load_state_dict", "in place", "assign"])
def test_new_text_weights_invalidate_the_cache(how):
    check_the_cache_follows_the_weights(how)


def test_a_cache_blind_to_the_weights_fails_the_check():
    with mock.patch("samfast.sam3.text_cache.weights_version", lambda module: ()):
        with pytest.raises(AssertionError):
            check_the_cache_follows_the_weights("load_state_dict")
