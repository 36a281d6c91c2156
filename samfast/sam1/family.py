"""SAM 1's record in the family registry (samfast.families)."""

from samfast.families import Family, register
from samfast.sam1.checkpoint import SAM1_KEY, check_state_dict, infer_model_type, synthetic_state_dict
from samfast.sam1.config import MODEL_TYPES, model_config
from samfast.sam1.sam import build_sam_modules
from samfast.stages import SWITCHES

SAM1 = register(
    Family(
        name="SAM 1",
        model_types=MODEL_TYPES,
        config=model_config,
        build_modules=build_sam_modules,
        synthetic_state_dict=synthetic_state_dict,
        check_state_dict=check_state_dict,
        state_dict_key=SAM1_KEY,
        infer_model_type=infer_model_type,
        built_switches=frozenset(SWITCHES),
        reference="segment_anything",
        tasks=frozenset({"point", "amg"}),
        official_checkpoint="sam_{model_type}_*.pth",
    )
)
