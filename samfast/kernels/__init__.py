"""Hand-written kernels: the fused rel-pos attention (Triton) with its reference path."""

from samfast.kernels.relpos_attention import (
    FALLBACK_COUNTS,
    fallback_counts,
    forms_bias_from_tables,
    rel_factors_from_tables,
    relpos_attention,
    relpos_attention_from_tables,
    relpos_attention_reference,
    reset_fallback_counts,
)

__all__ = [
    "FALLBACK_COUNTS",
    "fallback_counts",
    "forms_bias_from_tables",
    "rel_factors_from_tables",
    "relpos_attention",
    "relpos_attention_from_tables",
    "relpos_attention_reference",
    "reset_fallback_counts",
]
