"""Hand-written Triton kernels with their reference paths: the fused rel-pos attention of the
encoder, Hiera's small-window attention, the quantized MLP's GELU + quantization, the decoder's folded
cross attentions and its fused upscaling, SAM 2's memory keys projected and rotated at once, its mask
downsampler's convs with their norms and GELUs and Hiera's first norms with a channel of ones for the
biases; fallbacks of all are counted in dispatch."""

from samfast.kernels.bias_channel_norm import norm_with_bias_channel, norm_with_bias_channel_reference
from samfast.kernels.decoder_attention import (
    image_to_token_attention,
    image_to_token_attention_reference,
    token_to_image_attention,
    token_to_image_attention_reference,
)
from samfast.kernels.dispatch import FALLBACK_COUNTS, fallback_counts, reset_fallback_counts
from samfast.kernels.gelu_quantize import gelu_quantize, gelu_quantize_reference, quantized_linear
from samfast.kernels.mask_downsample import downsample_conv, downsample_conv_reference
from samfast.kernels.mask_upscale import upscaled_masks, upscaled_masks_reference
from samfast.kernels.relpos_attention import (
    forms_bias_from_tables,
    rel_factors_from_tables,
    relpos_attention,
    relpos_attention_from_tables,
    relpos_attention_reference,
)
from samfast.kernels.rotated_keys import rotated_keys
from samfast.kernels.window_attention import window_attention, window_attention_reference

__all__ = [
    "FALLBACK_COUNTS",
    "downsample_conv",
    "downsample_conv_reference",
    "fallback_counts",
    "forms_bias_from_tables",
    "gelu_quantize",
    "gelu_quantize_reference",
    "image_to_token_attention",
    "image_to_token_attention_reference",
    "norm_with_bias_channel",
    "norm_with_bias_channel_reference",
    "quantized_linear",
    "rel_factors_from_tables",
    "relpos_attention",
    "relpos_attention_from_tables",
    "relpos_attention_reference",
    "reset_fallback_counts",
    "rotated_keys",
    "token_to_image_attention",
    "token_to_image_attention_reference",
    "upscaled_masks",
    "upscaled_masks_reference",
    "window_attention",
    "window_attention_reference",
]
