"""Hand-written Triton kernels with their reference paths: the fused rel-pos attention of the
encoder, the quantized MLP's GELU + quantization and the decoder's fused upscaling; fallbacks of all
are counted in dispatch."""

from samfast.kernels.dispatch import FALLBACK_COUNTS, fallback_counts, reset_fallback_counts
from samfast.kernels.gelu_quantize import gelu_quantize, gelu_quantize_reference, quantized_linear
from samfast.kernels.mask_upscale import upscaled_masks, upscaled_masks_reference
from samfast.kernels.relpos_attention import (
    forms_bias_from_tables,
    rel_factors_from_tables,
    relpos_attention,
    relpos_attention_from_tables,
    relpos_attention_reference,
)

__all__ = [
    "FALLBACK_COUNTS",
    "fallback_counts",
    "forms_bias_from_tables",
    "gelu_quantize",
    "gelu_quantize_reference",
    "quantized_linear",
    "rel_factors_from_tables",
    "relpos_attention",
    "relpos_attention_from_tables",
    "relpos_attention_reference",
    "reset_fallback_counts",
    "upscaled_masks",
    "upscaled_masks_reference",
]
