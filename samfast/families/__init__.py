"""Model families as records: a Family per family, registered once by its own package, and
family_of(model_type), through which the shared code dispatches; ServesFamilies picks a shared API
class's family subclass by the model it is given."""

from samfast.families.record import Family
from samfast.families.registry import (
    families_supporting,
    family_of,
    family_of_state_dict,
    model_types,
    register,
)
from samfast.families.serves import ServesFamilies

__all__ = [
    "Family",
    "ServesFamilies",
    "families_supporting",
    "family_of",
    "family_of_state_dict",
    "model_types",
    "register",
]
