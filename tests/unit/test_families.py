"""Families as records (samfast.families): the shared code asks a model type's Family record, never
which family it is, and a new family is one folder plus one `register(Family(...))`.

The family-test scan reads the source with ast, so a test inside a function or on one code path is
found too; it has a planted defect of each kind it looks for.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import samfast
from samfast import CheckpointError, StageError
from samfast.checkpoint import read_checkpoint
from samfast.families import Family, family_of, family_of_state_dict, model_types, register, registry

REPO = Path(__file__).resolve().parents[2]
# Where code may tell families apart: the registry, and each family's own package, which checks that a
# model type is one of its own (sam2_config's lookup) and knows nothing of the others.
FAMILY_HOMES = ("samfast/families", "samfast/sam1", "samfast/sam2", "samfast/sam3")
SCANNED = ("samfast", "parity", "bench", "tinysam", "tools", "tests", "noxfile.py")
# The lists and tables of one family's model types (samfast.MODEL_TYPES is SAM 1's alone)
FAMILY_TABLES = {"MODEL_TYPES", "SAM2_MODEL_TYPES", "MODEL_CONFIGS", "SAM2_CONFIGS"}
FAMILY_PREFIXES = ("sam3", "sam2", "sam_", "vit")  # how the model types of SAM 3, SAM 2 and SAM 1 are spelled
FAMILY_CLASSES = {"Sam", "SAM2Base"}  # each family's model class


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def family_tests(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place `source` asks which family a model type or model is of: a call of an
    is_<family>... predicate, `in` one family's table of model types, a model type's prefix, an
    isinstance of a family's model class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = _name(node.func) or ""
            if called.startswith("is_sam"):
                found.append((node.lineno, f"{called}()"))
            elif called == "startswith" and node.args and isinstance(node.args[0], ast.Constant) and \
                    isinstance(node.args[0].value, str) and node.args[0].value.startswith(FAMILY_PREFIXES):
                found.append((node.lineno, f"startswith({node.args[0].value!r})"))
            elif called == "isinstance" and len(node.args) == 2:
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                found += [(node.lineno, f"isinstance(..., {_name(c)})") for c in classes if _name(c) in FAMILY_CLASSES]
        elif isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and _name(right) in FAMILY_TABLES:
                    found.append((node.lineno, f"in {_name(right)}"))
    return found


def family_tests_in_tree(root: Path) -> list[str]:
    """'path:line: what' for each family test outside FAMILY_HOMES (this file's planted ones aside)."""
    problems = []
    for top in SCANNED:
        paths = [root / top] if top.endswith(".py") else sorted((root / top).rglob("*.py"))
        for path in paths:
            relative = path.relative_to(root).as_posix()
            if not path.is_file() or relative.startswith(FAMILY_HOMES) or path.resolve() == Path(__file__).resolve():
                continue
            problems += [f"{relative}:{line}: {what}" for line, what in family_tests(path.read_text())]
    return problems


def test_no_family_test_outside_the_family_homes():
    assert family_tests_in_tree(REPO) == [], "ask the model type's record (samfast.families.family_of) instead"


@pytest.mark.parametrize("planted, line, what", [
    ("if is_sam2_type(model_type):\n    pass", 1, "is_sam2_type()"),
    ("x = config.is_sam2_type(m)", 1, "is_sam2_type()"),
    ("ok = model_type not in SAM2_MODEL_TYPES", 1, "in SAM2_MODEL_TYPES"),
    ("def f(m):\n    return m in samfast.MODEL_TYPES", 2, "in MODEL_TYPES"),
    ("sam2 = row.model.startswith('sam2')", 1, "startswith('sam2')"),
    ("if isinstance(model, (nn.Module, SAM2Base)): pass", 1, "isinstance(..., SAM2Base)"),
])
def test_planted_family_test_is_found(tmp_path, planted, line, what):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "planted.py").write_text(planted + "\n")
    assert family_tests_in_tree(tmp_path) == [f"bench/planted.py:{line}: {what}"]


def test_a_family_home_may_check_its_own_types(tmp_path):
    (tmp_path / "samfast" / "sam2").mkdir(parents=True)
    (tmp_path / "samfast" / "sam2" / "config.py").write_text("ok = stem in SAM2_CONFIGS\n")
    assert family_tests_in_tree(tmp_path) == []


def test_looking_a_type_up_is_no_family_test():
    assert family_tests("for m in MODEL_TYPES: pass\nchoices = model_types()\nf = family_of(m).reference") == []


def test_every_model_type_has_one_family():
    assert model_types() == (*samfast.MODEL_TYPES, *samfast.SAM2_MODEL_TYPES, *samfast.sam3.MODEL_TYPES)
    assert {family_of(t).name for t in samfast.MODEL_TYPES} == {"SAM 1"}
    assert {family_of(t).name for t in samfast.SAM2_MODEL_TYPES} == {"SAM 2"}
    assert {family_of(t).name for t in samfast.sam3.MODEL_TYPES} == {"SAM 3"}
    with pytest.raises(ValueError, match=r"unknown model type 'sam4'; choose one of vit_h, .* \(SAM 2: sam2.1_hiera_t, .*\(SAM 3: sam3, "):
        family_of("sam4")


# --- a stand-in family: one registration, and the shared code builds and dispatches it -------------------
STAND_IN_KEY = "trunk.weight"


class StandInModel(nn.Module):
    """The least a model offers samfast.stages' fp32 stage: no attention, memory or decoder to switch."""

    static_batch = None
    switches = frozenset()

    def __init__(self, width: int) -> None:
        super().__init__()
        self.trunk = nn.Linear(width, width)

    def attention_modules(self):
        return {}

    def memory_cross_attentions(self):
        return {}

    def prompt_decoder(self):
        return None


def _stand_in_state(model_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    width = WIDTHS[model_type]
    generator = torch.Generator().manual_seed(seed)
    return {STAND_IN_KEY: torch.randn(width, width, generator=generator), "trunk.bias": torch.zeros(width)}


def _check_stand_in(state, config, expected) -> None:
    from samfast.checkpoint import refuse_layout_mismatch, refuse_other_family

    refuse_other_family(state, config["name"], f"pass a {config['name']} checkpoint")
    refuse_layout_mismatch(state, expected, config["name"])


WIDTHS = {"stand_in_s": 4, "stand_in_l": 8}
STAND_IN = Family(
    name="Stand-in",
    model_types=tuple(WIDTHS),
    config=lambda model_type: {"name": model_type, "width": WIDTHS[model_type]},
    build_modules=lambda config: StandInModel(config["width"]),
    synthetic_state_dict=_stand_in_state,
    check_state_dict=_check_stand_in,
    state_dict_key=STAND_IN_KEY,
    infer_model_type=lambda state: (next((t for t, w in WIDTHS.items() if w == state[STAND_IN_KEY].shape[0]), None),
                                    state[STAND_IN_KEY].shape[0], 1),
    built_switches=frozenset(),
    reference="stand_in_reference",
    tasks=frozenset({"point"}),
    official_checkpoint="{model_type}.pt",
)


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(registry, "FAMILIES", list(registry.FAMILIES))  # the registration ends with the test
    return register(STAND_IN)  # the one line a new family adds (in its own package's family.py)


def test_a_registered_family_is_built_and_dispatched(stand_in, tmp_path):
    assert family_of("stand_in_l") is stand_in and "stand_in_s" in model_types()
    model = samfast.build_sam("stand_in_l", device="cpu", seed=3)
    assert isinstance(model, StandInModel) and not model.training and model.switches == frozenset()
    assert torch.equal(model.trunk.weight, _stand_in_state("stand_in_l", 3)[STAND_IN_KEY])
    assert samfast.synthetic_state_dict("stand_in_s").keys() == {STAND_IN_KEY, "trunk.bias"}

    path = tmp_path / "stand_in_s.pt"  # a checkpoint file is read and sniffed as the stand-in's
    torch.save(_stand_in_state("stand_in_s", 1), path)
    assert family_of_state_dict(read_checkpoint(path)) is stand_in
    assert torch.equal(samfast.build_sam("stand_in_s", path, device="cpu").trunk.weight, torch.load(path)[STAND_IN_KEY])


def test_a_registered_familys_stages_and_checkpoints_are_checked(stand_in, tmp_path):
    with pytest.raises(StageError, match=r"the sdpa switch\(es\) are not built for Stand-in yet"):
        samfast.build_sam("stand_in_s", device="cpu", stages="fp32+sdpa")
    path = tmp_path / "sam_vit_tiny.pth"
    torch.save(samfast.synthetic_state_dict("vit_tiny"), path)
    with pytest.raises(CheckpointError, match=r"this is a SAM 1 checkpoint \(vit_tiny\), not a Stand-in one; you asked "
                       r"for stand_in_s\. Call build_sam\('vit_tiny', checkpoint=\.\.\.\) for it, or pass a stand_in_s"):
        samfast.build_sam("stand_in_s", path, device="cpu")
    with pytest.raises(CheckpointError, match=r"this is a Stand-in checkpoint \(stand_in_l\), not a SAM 1 one"):
        samfast.build_sam("vit_tiny", _stand_in_state("stand_in_l"), device="cpu")
    with pytest.raises(CheckpointError, match=r"holds no SAM 1 image encoder \(no 'image_encoder.patch_embed.proj.weight'"):
        samfast.build_sam("vit_tiny", {"model": {}}, device="cpu")  # a dict of no family, given as a checkpoint
    with pytest.raises(CheckpointError, match=r"does not fit stand_in_s: shape mismatches: .*trunk.weight: checkpoint \(8, 8\) vs model \(4, 4\)"):
        samfast.build_sam("stand_in_s", _stand_in_state("stand_in_l"), device="cpu")
    # a seed beside a checkpoint would be ignored: refused, so the caller learns which weights it gets
    with pytest.raises(CheckpointError, match=r"got both a checkpoint and seed=0: .* pass one of them"):
        samfast.build_sam("stand_in_s", _stand_in_state("stand_in_s"), seed=0, device="cpu")


def test_a_family_takes_no_model_type_or_name_of_another(stand_in):
    from dataclasses import replace

    with pytest.raises(ValueError, match=r"model types \['vit_b'\] are SAM 1's already"):
        register(replace(STAND_IN, name="Other", model_types=("vit_b",)))
    with pytest.raises(ValueError, match="a family named 'Stand-in' is registered already"):
        register(replace(STAND_IN, model_types=("stand_in_xl",)))
