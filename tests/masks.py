"""Comparing thresholded masks without flaky pixels: only where the logit has decided the pixel.

Two correct implementations agree on logits to a tolerance (rounding of reordered additions), not
bit for bit. A pixel whose logit lies within that tolerance of the mask threshold may fall on
either side on a healthy machine, so a test that counts flipped pixels fails now and then for no
fault. The gate itself compares this way (masks of near-tie scores, logits with a tolerance);
every test that compares thresholded masks uses this helper.
"""

from __future__ import annotations

import numpy as np


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def assert_masks_equal_away_from_threshold(masks, reference_logits, *, atol: float, threshold: float = 0.0) -> None:
    """`masks` equal `reference_logits > threshold` at every pixel whose logit is farther than `atol` from it.

    `reference_logits` are the full-resolution logits the reference thresholded (e.g. its
    `predict(..., return_logits=True)`), `atol` the logits tolerance the test already holds the two
    implementations to. Fails, rather than passes vacuously, when no pixel is that far from the threshold.
    """
    masks, logits = _numpy(masks), _numpy(reference_logits).astype(np.float64)
    assert masks.dtype == np.bool_, f"masks must be boolean, got {masks.dtype}"
    assert masks.shape == logits.shape, f"mask shape {masks.shape} vs reference logits {logits.shape}"
    decided = np.abs(logits - threshold) > atol
    assert decided.any(), f"every logit lies within {atol} of the threshold {threshold}: nothing to compare"
    wrong = decided & (masks != (logits > threshold))
    if wrong.any():
        first = tuple(int(i) for i in np.argwhere(wrong)[0])
        raise AssertionError(
            f"{int(wrong.sum())} of {int(decided.sum())} pixels farther than {atol} from the threshold differ; "
            f"first at {first}: mask {bool(masks[first])}, reference logit {logits[first]:.6g}")
