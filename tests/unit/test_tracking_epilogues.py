"""The compile switch's fused paths in the tracker on a bf16 model (samfast.sam2.video_predictor.compile_tracking):
the memory attention MLP's linear1 + ReLU as one GEMM (samfast.modeling.common.linear_relu) and the
memory encoder's ConvNeXt blocks channels-last with their pwconv1 + GELU as one GEMM. Each path against
the module path in fp64, compiled without a graph break, and set by exactly the stages that should set it.
The CUDA GEMM's epilogue is checked in tests/gpu/test_stages_gpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import samfast
from samfast.modeling.common import linear_relu
from samfast.sam2.memory import attention as memory_attention
from samfast.sam2.memory.attention import MemoryAttentionLayer
from samfast.sam2.memory.encoder import CXBlock, MemoryEncoder
from samfast.modeling.rope import axial_rotations


def test_linear_relu_is_the_relu_of_the_linear_and_compiles_whole():
    torch.manual_seed(0)
    x, w, b = (torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(32, 16, dtype=torch.float64),
               torch.randn(32, dtype=torch.float64))
    want = F.relu(F.linear(x, w, b))
    assert (want == 0).any() and (want > 0).any()  # both sides of the ReLU taken
    torch.testing.assert_close(linear_relu(x, w, b), want, rtol=0, atol=1e-12)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(linear_relu, fullgraph=True)(x, w, b), want, rtol=0, atol=1e-12)


def _layer_inputs(objects: int = 2, side: int = 4, frames: int = 2, pointers: int = 4):
    generator = torch.Generator().manual_seed(1)
    tokens, memory = side * side, frames * side * side + pointers

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    return (rand(objects, tokens, 32), rand(objects, memory, 16), rand(objects, memory, 16),
            axial_rotations(32, side, side).double(), pointers)


def test_memory_attention_mlp_epilogue_path_equals_the_module_path_and_runs_the_fused_op(monkeypatch):
    torch.manual_seed(0)
    layer = MemoryAttentionLayer(32, 64, 16).double().eval().requires_grad_(False)
    inputs = _layer_inputs()
    want = layer(*inputs)
    calls = []
    monkeypatch.setattr(memory_attention, "linear_relu", lambda *a: calls.append(1) or linear_relu(*a))
    layer.relu_impl = "epilogue"
    got = layer(*inputs)
    assert calls == [1]  # the path ran: one fused GEMM per layer call
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(layer, fullgraph=True)(*inputs), want, rtol=0, atol=1e-12)


def test_cxblock_channels_last_and_epilogue_paths_match_the_module_path():
    torch.manual_seed(0)
    block = CXBlock(16).double().eval().requires_grad_(False)
    block.gamma.data.fill_(0.5)  # sam2's init (1e-6) would hide the MLP's part in the residual
    x = torch.randn(2, 16, 9, 9, dtype=torch.float64)
    want = block(x)
    block.channels_last = True
    got = block(x)
    assert got.is_contiguous(memory_format=torch.channels_last)  # and stays so for the next block
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    block.gelu_impl = "epilogue"
    fused = block(x)
    # the tanh GELU: within its 4.7e-4 of the exact one (times gamma and pwconv2), yet not the exact one
    assert 1e-8 < (fused - want).abs().max() < 1e-2
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(block, fullgraph=True)(x), fused, rtol=0, atol=1e-12)


def test_memory_encoder_channels_last_path_equals_the_module_path():
    """The 1x1 convs as GEMMs over a channels-last map, given the frame features as the tracker lays them
    out (tokens first: (HW, B, C) permuted to (B, C, H, W))."""
    torch.manual_seed(0)
    encoder = MemoryEncoder(8, in_dim=16).double().eval().requires_grad_(False)
    for block in encoder.fuser.layers:
        block.gamma.data.fill_(0.5)
    pix_feat = torch.randn(9, 2, 16, dtype=torch.float64).permute(1, 2, 0).view(2, 16, 3, 3)
    masks = torch.randn(2, 1, 48, 48, dtype=torch.float64)
    want = encoder(pix_feat, masks)["vision_features"]
    encoder.channels_last = True
    for block in encoder.fuser.layers:
        block.channels_last = True
    got = encoder(pix_feat, masks)["vision_features"]
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("stages,fused", [("bf16+compile", True), ("bf16+compile+sdpa+triton", True),
                                          ("fp32+compile", False), ("bf16", False)])
def test_the_fused_tracking_paths_are_set_by_compile_on_a_bf16_model_only(stages, fused):
    """fp32 keeps sam2's arithmetic (the tanh GELU is within bf16's rounding, not fp32's); without compile
    the modules run as sam2 writes them."""
    model = samfast.build_sam_video("sam2.1_hiera_nano", device="cpu", stages=stages).model
    layers, blocks = model.memory_attention.layers, model.memory_encoder.fuser.layers
    assert {layer.relu_impl for layer in layers} == {"epilogue" if fused else "module"}
    assert {(block.channels_last, block.gelu_impl) for block in blocks} == {(True, "epilogue") if fused else (False, "module")}
    assert model.memory_encoder.channels_last == fused
