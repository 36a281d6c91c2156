"""bench.kernel_kinds: profiler kernel names (as the H100 and H200 profiles under docs/measurements show them)
sorted into kinds, and a profile's time summed by kind."""

from __future__ import annotations

import pytest

from bench.kernel_kinds import OTHER, SAMFAST, by_kind, kind_of


@pytest.mark.parametrize(("name", "kind"), [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "attention (cuDNN / flash / efficient)"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention (cuDNN / flash / efficient)"),
    ("_window_attention_fwd", SAMFAST),
    ("_rotated_keys_fwd", SAMFAST),
    ("triton_red_fused__to_copy_add_linear_accumulate_native_layer_norm_permute_repeat_transp", "inductor fused (triton_*)"),
    ("triton_poi_fused_convolution_0", "inductor fused (triton_*)"),
    ("void cudnn::cnn::conv2d_grouped_direct_kernel<false, true, false, false, false, false, float>", "convolution (cuDNN)"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "convolution (cuDNN)"),
    ("nvjet_sm90_tst_192x192_64x4_1x2_h_badd_coopB_TNN", "GEMM (cuBLAS / CUTLASS)"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma", "GEMM (cuBLAS / CUTLASS)"),
    ("Memcpy DtoD (Device -> Device)", "copies and fills"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous name", "copies and fills"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "ATen elementwise and reductions"),
    ("some_vendor_kernel", OTHER),
])
def test_each_kernel_name_has_its_kind(name, kind):
    assert kind_of(name) == kind


def test_time_is_summed_by_kind_largest_first():
    kinds = by_kind({"nvjet_sm90_a": 6.0, "triton_poi_fused_add_0": 1.0, "triton_per_fused_layer_norm_1": 2.5,
                     "_window_attention_fwd": 1.5})
    assert kinds == {"GEMM (cuBLAS / CUTLASS)": 6.0, "inductor fused (triton_*)": 3.5, SAMFAST: 1.5}
    assert list(kinds) == ["GEMM (cuBLAS / CUTLASS)", "inductor fused (triton_*)", SAMFAST]
