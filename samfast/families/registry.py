"""The registered families and the one question the shared code asks of a model type: its family.

A family registers its record once, in its own package (samfast/sam1/family.py,
samfast/sam2/family.py), which `import samfast` imports.
"""

from __future__ import annotations

from samfast.families.record import Family, StateDict

# in name order (SAM 1, SAM 2, ...), whatever order their packages are imported in
FAMILIES: list[Family] = []


def register(family: Family) -> Family:
    """Add `family` to the registry; ValueError if one of its model types or its name is taken."""
    for other in FAMILIES:
        if taken := set(family.model_types) & set(other.model_types):
            raise ValueError(f"family {family.name!r}: model types {sorted(taken)} are {other.name}'s already; rename them")
        if other.name == family.name:
            raise ValueError(f"a family named {family.name!r} is registered already; give the new one its own name")
    FAMILIES.append(family)
    FAMILIES.sort(key=lambda f: f.name)
    return family


def family_of(model_type: str) -> Family:
    """The family of `model_type`; ValueError listing every known model type for an unknown one."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    first, *others = FAMILIES
    choices = ", ".join(first.model_types) + "".join(f" ({f.name}: {', '.join(f.model_types)})" for f in others)
    raise ValueError(f"unknown model type {model_type!r}; choose one of {choices}")


def model_types() -> tuple[str, ...]:
    """Every registered model type, family by family."""
    return tuple(t for family in FAMILIES for t in family.model_types)


def family_of_state_dict(state_dict: StateDict) -> Family | None:
    """The family whose state-dict key `state_dict` holds, or None for a state dict of no family."""
    return next((family for family in FAMILIES if family.state_dict_key in state_dict), None)


def families_supporting(task: str) -> list[Family]:
    return [family for family in FAMILIES if family.supports(task)]
