"""Hiera's residual stream kept in window order (Hiera.forward_windowed), compiled in bf16 on the GPU.

The SAM 2 stage tests (tests/gpu/test_sam2_gpu.py) build hiera_t's windows, which pad their maps and
so keep the map-order forward; this is the path hiera_l takes at 1024. A trunk with hiera_l's windows
(8, 4, 16, 8), one block per stage plus a global one and narrow widths, at 1024 x 1024 (2 images):
compiled (inductor, cuBLAS's in-place accumulations, the deferred biases), its stage outputs must be
as close to the fp32 map-order forward as the bf16 map-order forward is, within a factor of 2; with the
first norms writing a channel of ones for the biases or not.
"""

from __future__ import annotations

import pytest
import torch

from samfast.sam2.backbones.hiera import Hiera
from tests.kernel_accuracy import relative_error

pytestmark = pytest.mark.gpu


def trunk_with_hiera_l_windows() -> Hiera:
    torch.manual_seed(0)
    trunk = Hiera(embed_dim=32, num_heads=1, stages=(1, 2, 3, 1), global_att_blocks=(4,),
                  window_pos_embed_bkg_spatial_size=(7, 7), window_spec=(8, 4, 16, 8))
    for p in trunk.parameters():
        torch.nn.init.normal_(p, std=0.1)
    for block in trunk.blocks:
        block.mlp.gelu_impl = "epilogue"  # what the compile switch sets on a bf16 encoder
    return trunk.cuda().eval()


@pytest.mark.parametrize("biases_as_channels", [False, True])
@torch.no_grad()
def test_compiled_window_order_stream_is_as_close_to_fp32_as_the_map_order(monkeypatch, biases_as_channels):
    """With biases_as_channels every block's first norm runs on kernels.norm_with_bias_channel (the triton
    switch's, for Hiera-L's narrow blocks) and qkv / proj take their biases from its channel of ones."""
    trunk = trunk_with_hiera_l_windows()
    for block in trunk.blocks:
        block.bias_as_channel = biases_as_channels
    assert trunk.keeps_window_order((256, 256))
    x = torch.randn(2, 3, 1024, 1024, device="cuda")
    with monkeypatch.context() as m:
        m.setattr(trunk, "keeps_window_order", lambda hw: False)
        fp32 = trunk(x)
        trunk.to(torch.bfloat16)
        map_order = trunk(x.bfloat16())
    torch._dynamo.reset()
    windowed = torch.compile(trunk, fullgraph=True, dynamic=False)(x.bfloat16())
    torch._dynamo.reset()
    for level, (ours, theirs, want) in enumerate(zip(windowed, map_order, fp32, strict=True)):
        err, map_err = relative_error(ours, want), relative_error(theirs, want)
        assert err <= 2 * map_err + 1e-3, f"stage {level + 1}: window order {err:.2e}, map order {map_err:.2e}"
