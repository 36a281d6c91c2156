"""The suite's mask comparison: blind to pixels on the threshold, strict everywhere else."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.masks import assert_masks_equal_away_from_threshold

ATOL = 1e-4


def _logits() -> np.ndarray:
    logits = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    logits[0, 0] = 0.5 * ATOL  # on the threshold, within the tolerance
    return logits


def test_a_flip_on_the_threshold_is_forgiven():
    logits = _logits()
    masks = logits > 0
    masks[0, 0] = not masks[0, 0]
    assert_masks_equal_away_from_threshold(masks, logits, atol=ATOL)
    assert_masks_equal_away_from_threshold(torch.from_numpy(masks), torch.from_numpy(logits), atol=ATOL)


def test_a_flip_away_from_the_threshold_fails_naming_the_pixel():
    """Planted defect: one decided pixel flipped."""
    logits = _logits()
    masks = logits > 0
    masks[7, 7] = False  # logit 1.0
    with pytest.raises(AssertionError, match=r"1 of 63 pixels .* first at \(7, 7\): mask False, reference logit 1"):
        assert_masks_equal_away_from_threshold(masks, logits, atol=ATOL)


def test_nothing_decided_is_not_a_pass():
    logits = np.full((4, 4), ATOL / 2, dtype=np.float32)
    with pytest.raises(AssertionError, match="nothing to compare"):
        assert_masks_equal_away_from_threshold(logits > 0, logits, atol=ATOL)


def test_logits_in_place_of_masks_are_refused():
    logits = _logits()
    with pytest.raises(AssertionError, match="masks must be boolean"):
        assert_masks_equal_away_from_threshold(logits, logits, atol=ATOL)
