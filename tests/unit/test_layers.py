"""The package layers: bench -> tinysam -> parity -> samfast, no import upward, no import circle in any of
them; inside parity, its subpackages in layers of their own (PARITY_LAYERS) and no task importing another;
inside samfast, no circle between its folders (samfast.sam2 <-> samfast.video counts, whatever modules
close it) and no family (FAMILIES) imported by the kernels, the shared modules (SHARED) or another family.
No package imports tests, and no package nor tools/ uses another package's private (`_name`) names:
what one needs of another is public there.

Read from the source with ast (every import, also the ones inside functions), so an import that only
runs on one code path is checked too. Each checker also gets a planted defect in a throwaway tree.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Lowest first: a package may import the ones at or below its own layer, never one above.
LAYERS = ("samfast", "parity", "tinysam", "bench")
# parity's concerns, lowest first, the same rule one level down: the reference packages' builders know
# only samfast; the golden store and datasets know no
# task and no check; a check (syncs, compile, budgets, switch proof) knows no verdict; comparison and
# reports know no task; a task (parity/tasks/<name>/) builds on all of those and on parity/tasks/*.py,
# never on another task; the CLI dispatches to tasks; the gate orchestrates the CLI and pytest.
PARITY_LAYERS = ("parity.reference", "parity.golden", "parity.checks", "parity.compare", "parity.report", "parity.tasks",
                 "parity.cli", "parity.gate")
# A model family's own code: what differs between families (trunk, neck, memory, builders).
FAMILIES = ("samfast.sam1", "samfast.sam2", "samfast.sam3")
# What every family builds on, so it never names one: a family subclasses or composes these, and a
# kernel takes its reference path as an argument (samfast.kernels.rotated_keys).
SHARED = ("samfast.kernels", "samfast.modeling", "samfast.video")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in the file; `from a import b` gives a.b when that is a module."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = root / Path(*base.split("."), alias.name)
                is_module = submodule.with_suffix(".py").is_file() or (submodule / "__init__.py").is_file()
                found.append((node.lineno, f"{base}.{alias.name}" if is_module else base))
    return found


def upward_imports(root: Path) -> list[str]:
    """'file:line: a imports b' for each import of a package from a layer above the importer's."""
    problems = []
    for rank, package in enumerate(LAYERS):
        for path in sorted((root / package).rglob("*.py")):
            for line, target in imports_of(path, root):
                top = target.split(".")[0]
                if top in LAYERS and LAYERS.index(top) > rank:
                    problems.append(f"{path.relative_to(root)}:{line}: {package} imports {target} (a layer above it)")
    return problems


# Where the private-names rule reads imports: the packages and tools/ (scripts that use them).
IMPORTERS = (*LAYERS, "tools")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def imports_of_tests(root: Path) -> list[str]:
    """'file:line: package imports tests...' for each import of the test suite from a package (tools/
    may: draw_layers.py draws this file's rules)."""
    problems = []
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            for line, target in sorted(set(imports_of(path, root))):
                if target == "tests" or target.startswith("tests."):
                    problems.append(f"{path.relative_to(root)}:{line}: {package} imports {target} (the test suite)")
    return problems


def private_names_used(root: Path) -> list[str]:
    """'file:line: importer uses name' for each private name (a `_name` module, an imported `_name`, or
    `module._name` on an imported module) of another package than the importer's own."""
    problems = []
    for package in IMPORTERS:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            where = path.relative_to(root)
            modules = {}  # local name -> the other package's module it is bound to
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] in LAYERS and alias.name.split(".")[0] != package:
                            modules[alias.asname or alias.name.split(".")[0]] = alias.name
                            if any(_private(part) for part in alias.name.split(".")):
                                problems.append(f"{where}:{node.lineno}: {package} uses {alias.name}")
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    top = node.module.split(".")[0]
                    if top not in LAYERS or top == package:
                        continue
                    for alias in node.names:
                        full = f"{node.module}.{alias.name}"
                        if any(_private(part) for part in full.split(".")):
                            problems.append(f"{where}:{node.lineno}: {package} uses {full}")
                        modules[alias.asname or alias.name] = full
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                        and node.value.id in modules):
                    problems.append(f"{where}:{node.lineno}: {package} uses {modules[node.value.id]}.{node.attr}")
    return problems


def parity_layer(module: str) -> int | None:
    """The index in PARITY_LAYERS of the concern a parity module belongs to (None: parity's own entry points)."""
    for rank, layer in enumerate(PARITY_LAYERS):
        if module == layer or module.startswith(layer + "."):
            return rank
    return None


def task_of(module: str) -> str | None:
    """'point' for parity.tasks.point.runner; None for modules outside a task (parity.tasks.source too)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["parity", "tasks"] else None


def parity_layer_violations(root: Path) -> list[str]:
    """'file:line: a imports b (why)' for each import inside parity against PARITY_LAYERS or between tasks."""
    problems = []
    for path in sorted((root / "parity").rglob("*.py")):
        source = module_name(path, root)
        rank = parity_layer(source)
        for line, target in imports_of(path, root):
            if rank is None or not target.startswith("parity."):
                continue
            target_rank = parity_layer(target)
            where = f"{path.relative_to(root)}:{line}: {source} imports {target}"
            if target_rank is not None and target_rank > rank:
                problems.append(f"{where} ({PARITY_LAYERS[target_rank]} is a layer above {PARITY_LAYERS[rank]})")
            elif task_of(source) and task_of(target) and task_of(source) != task_of(target):
                problems.append(f"{where} (a task never imports another task)")
    return problems


def folder_of(module: str) -> str:
    """The folder (or top-level module) under the package a module belongs to: samfast.sam2.memory.rope -> samfast.sam2."""
    return ".".join(module.split(".")[:2])


def import_cycle(root: Path, package: str, by_folder: bool = False) -> list[str]:
    """One import circle among the package's modules (as [a, b, ..., a]), or [] when there is none.
    by_folder: among its folders (folder_of), leaving out the entry points run as `python -m` (no module
    imports a __main__)."""
    graph: dict[str, set[str]] = {}
    for path in (root / package).rglob("*.py"):
        if by_folder and path.stem == "__main__":
            continue
        source = module_name(path, root)
        targets = {t for _, t in imports_of(path, root) if t.split(".")[0] == package}
        if by_folder:
            source, targets = folder_of(source), {folder_of(t) for t in targets}
        graph[source] = graph.get(source, set()) | (targets - {source})
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> list[str]:
        if node in trail:
            return trail[trail.index(node) :] + [node]
        if node in done or node not in graph:
            return []
        for target in sorted(graph[node]):
            if cycle := visit(target, [*trail, node]):
                return cycle
        done.add(node)
        return []

    for start in sorted(graph):
        if cycle := visit(start, []):
            return cycle
    return []


def family_imports(root: Path) -> list[str]:
    """'file:line: a imports b (why)' for each import of a family (FAMILIES) by the kernels, a shared module
    or another family: a family builds on the shared modules only, so that one can be added or removed alone."""
    problems = []
    for importer in (*SHARED, *FAMILIES):
        for path in sorted((root / Path(*importer.split("."))).rglob("*.py")):
            for line, target in imports_of(path, root):
                family = next((f for f in FAMILIES if target == f or target.startswith(f + ".")), None)
                if family and family != importer:
                    problems.append(f"{path.relative_to(root)}:{line}: {importer} imports {target} ({family} is a "
                                    "family: move what both need to a shared module, or pass it in)")
    return problems


def test_no_package_imports_a_layer_above_it():
    assert upward_imports(REPO) == []


@pytest.mark.parametrize("package", LAYERS)
def test_package_has_no_import_circle(package):
    assert import_cycle(REPO, package) == []


def test_no_package_imports_the_tests():
    assert imports_of_tests(REPO) == []


def test_no_package_uses_another_packages_private_names():
    assert private_names_used(REPO) == []


def test_samfast_folders_have_no_import_circle():
    assert import_cycle(REPO, "samfast", by_folder=True) == []


def test_kernels_shared_modules_and_families_import_no_other_family():
    assert family_imports(REPO) == []


def test_parity_concerns_keep_their_layers():
    assert parity_layer_violations(REPO) == []


def test_every_parity_module_belongs_to_a_concern():
    """A new module at parity's top level is a new concern: add it to PARITY_LAYERS (or to the entry points)."""
    entry_points = {"parity", "parity.__main__", "parity.cli", "parity.html_report"}
    stray = sorted(m for m in (module_name(p, REPO) for p in (REPO / "parity").rglob("*.py"))
                   if parity_layer(m) is None and m not in entry_points)
    assert stray == []


def test_each_samfast_module_imports_on_its_own():
    """Each module imported first (samfast forgotten before each), in one subprocess: torch loads once.

    Importing samfast.x.y runs samfast/__init__.py to its end first, so every module that `import samfast`
    loads imports exactly as `import samfast` does: that import once, then each module it does not load
    imported first on its own."""
    names = sorted(module_name(p, REPO) for p in (REPO / "samfast").rglob("*.py"))
    script = (
        "import importlib, sys\n"
        "def fresh(name):\n"
        "    for loaded in [m for m in sys.modules if m == 'samfast' or m.startswith('samfast.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "    assert not {'parity', 'tinysam', 'bench'} & {m.split('.')[0] for m in sys.modules}, name\n"
        "fresh('samfast')\n"
        "with_the_package = set(sys.modules)\n"
        f"for name in {names!r}:\n"
        "    if name not in with_the_package:\n"
        "        fresh(name)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_planted_upward_import_is_reported(tmp_path):
    root = _tree(tmp_path, {
        "samfast/__init__.py": "",
        "samfast/model.py": "def f():\n    from parity.report import write\n",
        "parity/__init__.py": "",
        "parity/report.py": "import bench.ladder\nfrom samfast import model\n",
        "bench/__init__.py": "",
        "bench/ladder.py": "import parity.report\n",
    })
    assert upward_imports(root) == [
        "samfast/model.py:2: samfast imports parity.report (a layer above it)",
        "parity/report.py:1: parity imports bench.ladder (a layer above it)",
    ]


def test_planted_circle_is_reported(tmp_path):
    """The circle this test was written for: quantize needs stages' error, stages calls quantize (lazily)."""
    root = _tree(tmp_path, {
        "samfast/__init__.py": "from samfast.stages import parse\n",
        "samfast/quantize.py": "from samfast.stages import StageError\n",
        "samfast/stages.py": "class StageError(ValueError): ...\ndef apply():\n    from .quantize import q\n",
    })
    assert import_cycle(root, "samfast") == ["samfast.stages", "samfast.quantize", "samfast.stages"]


def test_planted_circle_is_reported_in_parity(tmp_path):
    """The circle the report package had: the markdown report rendered HTML, the HTML report read markdown helpers."""
    root = _tree(tmp_path, {
        "parity/__init__.py": "",
        "parity/report/__init__.py": "",
        "parity/report/verdicts.py": "def write():\n    from parity.report.html import render_html\n",
        "parity/report/html.py": "from parity.report.verdicts import fmt\n",
    })
    assert import_cycle(root, "parity") == ["parity.report.html", "parity.report.verdicts", "parity.report.html"]


def test_planted_parity_layer_violations_are_reported(tmp_path):
    """The store reaching into a task, a report importing the gate, one task reaching into another."""
    root = _tree(tmp_path, {
        "parity/__init__.py": "",
        "parity/golden/__init__.py": "",
        "parity/golden/manifest.py": "from parity.tasks.point.produce import StageOutputs\n",
        "parity/report/__init__.py": "",
        "parity/report/html.py": "def f():\n    from parity.gate import run\n",
        "parity/gate/__init__.py": "",
        "parity/gate/run.py": "from parity.tasks.point import runner\n",
        "parity/tasks/__init__.py": "",
        "parity/tasks/source.py": "",
        "parity/tasks/point/__init__.py": "",
        "parity/tasks/point/produce.py": "from parity.tasks.source import ModelSource\n",
        "parity/tasks/point/runner.py": "from parity.tasks.amg.runner import POINTS\n",
        "parity/tasks/amg/__init__.py": "",
        "parity/tasks/amg/runner.py": "from parity.golden import manifest\n",
    })
    assert parity_layer_violations(root) == [
        "parity/golden/manifest.py:1: parity.golden.manifest imports parity.tasks.point.produce "
        "(parity.tasks is a layer above parity.golden)",
        "parity/report/html.py:2: parity.report.html imports parity.gate.run (parity.gate is a layer above parity.report)",
        "parity/tasks/point/runner.py:1: parity.tasks.point.runner imports parity.tasks.amg.runner "
        "(a task never imports another task)",
    ]


def test_planted_imports_of_tests_and_private_names_are_reported(tmp_path):
    """The imports these rules were written for: bench reading the tests' reference wrappers, tinysam a
    private loader of parity's, tools a private pattern; a package's own private names stay allowed."""
    root = _tree(tmp_path, {
        "samfast/__init__.py": "",
        "samfast/_impl.py": "",
        "samfast/model.py": "from samfast._impl import _helper\n",
        "parity/__init__.py": "",
        "parity/golden/__init__.py": "",
        "parity/golden/data.py": "def _index(): ...\ndef load_dataset(): ...\n",
        "parity/checks/__init__.py": "",
        "parity/checks/syncs.py": "_SYNC_CALL = None\n",
        "tinysam/__init__.py": "",
        "tinysam/validation.py": "from parity.golden.data import _index, load_dataset\nimport samfast._impl\n",
        "bench/__init__.py": "",
        "bench/ladder.py": "def f():\n    from tests.reference import reference_sam, LOGITS_ATOL\n",
        "parity/gate/__init__.py": "",
        "parity/gate/run.py": "import tests\n",
        "tools/capture.py": "from parity.checks import syncs\nprint(syncs._SYNC_CALL, syncs.__name__)\n",
    })
    assert imports_of_tests(root) == [
        "parity/gate/run.py:1: parity imports tests (the test suite)",
        "bench/ladder.py:2: bench imports tests.reference (the test suite)",
    ]
    assert private_names_used(root) == [
        "tinysam/validation.py:1: tinysam uses parity.golden.data._index",
        "tinysam/validation.py:2: tinysam uses samfast._impl",
        "tools/capture.py:2: tools uses parity.checks.syncs._SYNC_CALL",
    ]


def test_planted_folder_circle_is_reported(tmp_path):
    """The circle samfast.sam2 and samfast.video had: the tracker imported the bank, the video builder SAM 2's
    builder; no module circle, a folder one; an entry point (amg's __main__ importing video) closes none."""
    root = _tree(tmp_path, {
        "samfast/__init__.py": "",
        "samfast/sam2/__init__.py": "",
        "samfast/sam2/tracker.py": "from samfast.video.memory_bank import MemoryBank\n",
        "samfast/sam2/build.py": "",
        "samfast/video/__init__.py": "",
        "samfast/video/memory_bank.py": "",
        "samfast/video/build.py": "from samfast.sam2.build import build_sam2_model\n",
        "samfast/video/__main__.py": "",
        "samfast/amg/__init__.py": "",
        "samfast/amg/__main__.py": "from samfast.video import build\n",
        "samfast/video/predictor.py": "def f():\n    from samfast.amg import generator\n",
        "samfast/amg/generator.py": "",
    })
    assert import_cycle(root, "samfast") == []
    assert import_cycle(root, "samfast", by_folder=True) == ["samfast.sam2", "samfast.video", "samfast.sam2"]


def test_planted_family_imports_are_reported(tmp_path):
    """The import rotated_keys had (the kernel's reference from SAM 2's rope), a shared decoder reaching into
    a family, a video module importing SAM 3 inside a function, and one family importing another; a family
    importing shared code or its own modules is fine."""
    root = _tree(tmp_path, {
        "samfast/__init__.py": "",
        "samfast/kernels/__init__.py": "",
        "samfast/kernels/rotated_keys.py": "def ref():\n    from samfast.sam2.memory.rope import rotate_frames\n",
        "samfast/modeling/__init__.py": "",
        "samfast/modeling/mask_decoder.py": "from samfast.sam1 import config\n",
        "samfast/video/__init__.py": "",
        "samfast/video/predictor.py": "import torch\n\ndef f():\n    import samfast.sam3.tracker\n",
        "samfast/sam2/__init__.py": "",
        "samfast/sam2/memory/__init__.py": "",
        "samfast/sam2/memory/rope.py": "from samfast.modeling import mask_decoder\n",
        "samfast/sam1/__init__.py": "",
        "samfast/sam1/config.py": "",
        "samfast/sam3/__init__.py": "",
        "samfast/sam3/tracker.py": "from samfast.video import predictor\nfrom samfast.sam3 import vit\n",
        "samfast/sam3/vit.py": "from samfast.sam2.memory import rope\n",
    })
    assert family_imports(root) == [
        "samfast/kernels/rotated_keys.py:2: samfast.kernels imports samfast.sam2.memory.rope (samfast.sam2 is a "
        "family: move what both need to a shared module, or pass it in)",
        "samfast/modeling/mask_decoder.py:1: samfast.modeling imports samfast.sam1.config (samfast.sam1 is a "
        "family: move what both need to a shared module, or pass it in)",
        "samfast/video/predictor.py:4: samfast.video imports samfast.sam3.tracker (samfast.sam3 is a "
        "family: move what both need to a shared module, or pass it in)",
        "samfast/sam3/vit.py:1: samfast.sam3 imports samfast.sam2.memory.rope (samfast.sam2 is a "
        "family: move what both need to a shared module, or pass it in)",
    ]
