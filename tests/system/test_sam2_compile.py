"""SAM 2's compile switch: one graph for the Hiera encoder and one for the decoder, 0 graph breaks and 0
recompiles across images, 1..16 points per prompt and the nt switch's calls (prompts of 2 and 3 images
in one call), and its proof exercised.

sam2.1_hiera_t_5block (hiera_t's widths, windows and heads, one block of each kind: the windowed, pooled
and global code hiera_t compiles, in a fraction of its compile time) at a 256 x 256 input (the compiled
graph is the same code; 1024 only costs inductor time); the decoder on seeded features of the real shape.
"""

from __future__ import annotations

import pytest
import torch

import samfast
from parity.checks.compile import watch
from parity.checks.exercised import watch_switches
from samfast.stages import parse_stages
from tests.compile_backends import aot_eager_and_inductor

pytestmark = pytest.mark.slow

MODEL = "sam2.1_hiera_t_5block"


def in_image_features_layout(feat: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) in the memory layout SAM2Base.image_features returns: a (H*W, B, C) tensor permuted,
    whose batch stride is C (not C*H*W) for one image."""
    b, c, h, w = feat.shape
    return feat.flatten(2).permute(2, 0, 1).contiguous().permute(1, 2, 0).view(b, c, h, w)


# aot_eager: dynamo's and AOTAutograd's graphs and guards; inductor's lowering may add guards of its own
# (the point counts are dynamic), which the GPU runners check
@pytest.mark.parametrize("compile_backend", aot_eager_and_inductor(
    inductor_slow="inductor compiles the encoder and the decoder, whose point counts are dynamic: its lowering "
                  "may add guards of its own",
    gpu_runner="inductor's C++ compile of the encoder and the decoder; [aot_eager] checks dynamo's graphs and "
               "guards in the CPU run"), indirect=True)
def test_sam2_compiles_once_for_every_image_and_point_count(compile_backend):
    gen = torch.Generator().manual_seed(0)
    embedding, high_res = torch.randn(1, 256, 64, 64, generator=gen), [torch.randn(1, 32, 256, 256, generator=gen),
                                                                       torch.randn(1, 64, 128, 128, generator=gen)]
    with watch_switches(parse_stages("fp32+compile")) as used, watch() as seen, torch.no_grad():
        model = used.watch(samfast.build_sam(MODEL, device="cpu", stages="fp32+compile"))
        for _ in range(2):  # two images
            model.image_features(torch.randn(1, 3, 256, 256, generator=gen))
        for n in range(1, 17):  # points per prompt (sam2's padding point makes n + 1 tokens), and two prompt counts
            points = torch.rand(1 + n % 2, n, 2, generator=gen) * 1024
            labels = torch.ones(1 + n % 2, n, dtype=torch.int)
            sparse, dense = model.sam_prompt_encoder(points=(points, labels), boxes=None, masks=None)
            # repeat_image as the image predictor passes it: True for several prompts, False for one
            # the features in either layout the predictors hand over (dynamo guards on strides)
            layout = in_image_features_layout if n % 4 == 1 else torch.Tensor.contiguous
            model.sam_mask_decoder(layout(embedding), model.sam_prompt_encoder.get_dense_pe(), sparse, dense,
                                   n % 3 == 0, points.shape[0] > 1, [layout(feat) for feat in high_res])
        for images, counts in ((2, [1, 3]), (3, [2, 1, 4])):  # the nt switch: several images' prompts in one call
            features = [torch.randn(images, *x.shape[1:], generator=gen) for x in (embedding, *high_res)]
            points = torch.rand(sum(counts), 2, 2, generator=gen) * 1024
            sparse, dense = model.sam_prompt_encoder(points=(points, torch.ones(sum(counts), 2, dtype=torch.int)),
                                                     boxes=None, masks=None)
            image_index = torch.repeat_interleave(torch.arange(images), torch.tensor(counts))
            model.sam_mask_decoder(features[0], model.sam_prompt_encoder.get_dense_pe(), sparse, dense, True, False,
                                   features[1:], image_index=image_index)
    seen.assert_clean()
    assert seen.graphs_compiled == 2 and used.exercised == ["compile: 2 graph(s) compiled"]


@pytest.mark.slow(reason="seven decoder calls, each traced or run twice (compiled and eager) with the kernels' math in torch ops")
@pytest.mark.usefixtures("triton_interpreted", "aot_eager_compile")
def test_sam2_decoder_compiled_with_its_kernels_pads_to_the_widest_and_never_recompiles(monkeypatch):
    """The triton switch's fused graph takes prompts of 2..9 tokens in one graph (the kernels padded to their
    widest, a width constant at trace time), more go to the module graph, and so do calls of fewer prompts
    than MIN_FUSED_PROMPTS (the kernels would leave the GPU idle): 2 graphs, no recompile, the module
    path's masks. The kernels' launches are their math in torch ops here (the CPU); on the GPU
    tests/gpu/test_decoder_attention_gpu.py runs the kernels themselves. The fused graph's threshold is
    lowered from 32 prompts to 4 (the routing reads it per call): the decoder's arithmetic over 32 prompts,
    compiled and eager, was most of this test's time on 2 cores, and the routing is the same at any count."""
    from samfast.modeling.sam2_prompting import mask_decoder
    from tests.decoder_kernel_ops import kernels_as_torch_ops
    from tests.sam2_decoder_inputs import sam2_decoder_inputs

    kernels_as_torch_ops(monkeypatch)
    monkeypatch.setattr(mask_decoder, "MIN_FUSED_PROMPTS", 4)
    MIN_FUSED_PROMPTS = mask_decoder.MIN_FUSED_PROMPTS
    # aot_eager_compile: the guards on the token count are dynamo's and AOTAutograd's; inductor's CPU code
    # generation would only add a minute
    model = samfast.build_sam("sam2.1_hiera_nano", device="cpu", stages="fp32+compile+triton")
    decoder, eager = model.sam_mask_decoder, samfast.build_sam("sam2.1_hiera_nano", device="cpu").sam_mask_decoder
    routed = []  # the graph each call took: True for the fused one
    decoder.compiled_predict_masks = {fused: lambda *args, _graph=graph, _fused=fused: routed.append(_fused) or _graph(*args)
                                      for fused, graph in decoder.compiled_predict_masks.items()}
    with watch() as seen, torch.no_grad():
        # 8 points, sam2's padding point and 6 output tokens: 15 of 16; 9 and 16 points: too many tokens
        for prompts, points in [(MIN_FUSED_PROMPTS, n) for n in (1, 4, 8, 9, 16)] + [(MIN_FUSED_PROMPTS - 1, 1), (1, 1)]:
            embeddings, pe, sparse, dense, high_res, index = sam2_decoder_inputs(model, prompts, points_per_prompt=points)
            got = decoder(embeddings, pe, sparse, dense, True, False, high_res, image_index=index)
            want = eager(embeddings, pe, sparse, dense, True, False, high_res, image_index=index)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    seen.assert_clean()
    assert seen.graphs_compiled == 2
    assert routed == [True] * 3 + [False] * 4  # 9 and 16 points, then too few prompts: the module graph
