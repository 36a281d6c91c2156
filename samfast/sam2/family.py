"""SAM 2's record in the family registry (samfast.families)."""

from samfast.families import Family, register
from samfast.sam2.checkpoint import check_sam2_state_dict, synthetic_state_dict
from samfast.sam2.config import SAM2_MODEL_TYPES, TRUNK_KEY, infer_sam2_model_type, sam2_config
from samfast.sam2.sam2_base import build_sam2_modules

# the switches built for SAM 2 so far: the lossless ones (triton: the decoder's Triton kernels, Hiera
# having no rel-pos attention for it; nt: predict_batch decodes every image's prompts in one call), and
# int8 / fp8 on Hiera's linears (the encoder_linears the model names); sparse is not
SAM2_SWITCHES = frozenset({"bf16", "compile", "sdpa", "triton", "nt", "int8", "fp8"})

SAM2 = register(
    Family(
        name="SAM 2",
        model_types=SAM2_MODEL_TYPES,
        config=sam2_config,
        build_modules=build_sam2_modules,
        synthetic_state_dict=synthetic_state_dict,
        check_state_dict=check_sam2_state_dict,
        state_dict_key=TRUNK_KEY,
        infer_model_type=infer_sam2_model_type,
        built_switches=SAM2_SWITCHES,
        reference="sam2",
        tasks=frozenset({"point", "amg", "video"}),
        official_checkpoint="{model_type}_*.pt",
    )
)
