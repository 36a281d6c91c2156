"""samfast.modeling.connected_components against scipy's labelling in 8-connectivity (what scikit-image's
label, cc_torch and sam3's Triton kernel find): every pixel's component size, exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage

from samfast.modeling.connected_components import component_sizes


def scipy_sizes(mask: np.ndarray) -> np.ndarray:
    """Each True pixel's 8-connected component size, 0 on False pixels, one (H, W) mask at a time."""
    out = np.zeros(mask.shape, dtype=np.int64)
    for index in np.ndindex(mask.shape[:-2]):
        labels, _ = ndimage.label(mask[index], structure=np.ones((3, 3), dtype=bool))
        sizes = np.bincount(labels.ravel())
        sizes[0] = 0
        out[index] = sizes[labels]
    return out


@pytest.mark.parametrize("density", [0.2, 0.45, 0.6, 0.9])
def test_random_masks_of_a_batch_equal_scipys(density):
    # near 0.45-0.6 the components are large and winding (site percolation on 8 neighbours): the most rounds
    mask = torch.rand(2, 3, 48, 40, generator=torch.Generator().manual_seed(int(100 * density))) < density
    np.testing.assert_array_equal(component_sizes(mask).numpy(), scipy_sizes(mask.numpy()))


def test_diagonal_neighbours_join_and_masks_of_a_batch_never_do():
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[0, 0, 0] = mask[0, 1, 1] = mask[0, 2, 2] = True  # one component through corners only
    mask[0, 3, 0] = True  # alone
    mask[1, 0, 3] = True  # beside mask 0's pixels in memory, another mask
    sizes = component_sizes(mask)
    assert sizes[0, 0, 0] == sizes[0, 1, 1] == sizes[0, 2, 2] == 3  # a 4-connected labelling gives 1 each
    assert sizes[0, 3, 0] == 1 and sizes[1, 0, 3] == 1 and sizes.count_nonzero() == 5


def test_a_long_winding_path_is_one_component():
    """A snake through a 64 x 64 mask: the longest path a mask of that size holds, the most rounds."""
    mask = torch.zeros(64, 64, dtype=torch.bool)
    mask[::4] = True
    for row in range(0, 60, 4):
        mask[row:row + 4, 63 if row % 8 == 0 else 0] = True
    sizes = component_sizes(mask)
    assert sizes[mask].unique().tolist() == [int(mask.sum())]


def test_empty_and_full_masks():
    assert component_sizes(torch.zeros(5, 7, dtype=torch.bool)).count_nonzero() == 0
    assert component_sizes(torch.ones(5, 7, dtype=torch.bool)).unique().tolist() == [35]


def test_a_mask_that_is_not_bool_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="compare it with a threshold"):
        component_sizes(torch.zeros(4, 4))
