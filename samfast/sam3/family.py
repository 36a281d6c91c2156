"""SAM 3's record in the family registry (samfast.families)."""

from samfast.families import Family, register
from samfast.sam3.checkpoint import (
    SAM3_KEY,
    check_sam3_state_dict,
    infer_sam3_model_type,
    model_layout,
    synthetic_state_dict,
)
from samfast.sam3.config import MODEL_TYPES, build_image_model, sam3_config

# the switches built for SAM 3 so far: bf16, compile and sdpa (the ViT, the text encoder, the detector), and
# int8 / fp8 on the ViT blocks' linears (not yet timed on a GPU); SAM 3 has no SAM-style prompt decoder for
# triton and nt
SAM3_SWITCHES = frozenset({"bf16", "compile", "sdpa", "int8", "fp8"})

SAM3 = register(
    Family(
        name="SAM 3",
        model_types=MODEL_TYPES,
        config=sam3_config,
        build_modules=build_image_model,
        synthetic_state_dict=synthetic_state_dict,
        check_state_dict=check_sam3_state_dict,
        state_dict_key=SAM3_KEY,
        infer_model_type=infer_sam3_model_type,
        built_switches=SAM3_SWITCHES,
        reference="sam3",
        tasks=frozenset({"concept"}),  # phrases to every instance (parity.tasks.concept)
        official_checkpoint="sam3.pt",
        model_layout=model_layout,
        default_seed=None,
    )
)
