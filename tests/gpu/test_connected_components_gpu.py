"""samfast's connected components on a GPU equal sam3's there (sam3.perflib.connected_components: cc_torch
when installed, else its Triton kernel), the ones its predict_inst fills holes with on a GPU."""

from __future__ import annotations

import pytest
import torch

from samfast.modeling.connected_components import component_sizes

pytestmark = pytest.mark.gpu
sam3_components = pytest.importorskip("sam3.perflib.connected_components",
                                      reason="the SAM 3 reference package sam3==0.1.4 is not installed")


@pytest.mark.parametrize("density", [0.2, 0.5, 0.9])
def test_component_sizes_equal_sam3s_on_the_gpu(density):
    mask = torch.rand(6, 1, 256, 256, generator=torch.Generator().manual_seed(7), device="cpu") < density
    mask = mask.cuda()
    labels, sizes = sam3_components.connected_components(mask.to(torch.uint8))
    want = torch.where(labels > 0, sizes, 0).long()
    got = component_sizes(mask)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got.cpu(), component_sizes(mask.cpu()), rtol=0, atol=0)
