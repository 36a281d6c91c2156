"""The Python bytecode of the processes the gate starts: read where the install left it, else kept and
compiled once in the compile cache's folder before any step starts.

Container images often set PYTHONDONTWRITEBYTECODE or install site-packages without bytecode (the H100
runner's torch: no .pyc among 2141 .py files; device-prep installs with pip --no-compile), and then every
process the gate starts (xdist workers, inductor's compile workers, the checks, the CLI tests'
interpreters) compiles torch's source again: about 8 CPU-s each on the 2-core machine (`import torch,
torch._inductor.compile_fx, samfast, tests.conftest, sam3.model_builder`: 14.9 s with no bytecode, 7.1 s
with it), and on the H100 runner a CPU compile check took 75 s warm and 58 s with bytecode
(docs/gpu-gate.md, commit ac283a5). There the children keep their bytecode under a prefix in the cache
folder, out of the installed tree that PYTHONDONTWRITEBYTECODE is usually set to protect, and `fill`
compiles it once, on every core, before the ~23 processes of a cold gate start at once.

Where pip compiled the installed tree (its default), a prefix would hide that bytecode from every child,
which would then compile torch again into an empty prefix: the environment is left as it is.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

# What the gate's processes import at start-up: torch and what it loads, the project, its references.
# A package that is not installed is skipped; one left out here is compiled by the first child that imports it.
PACKAGES = ("torch", "triton", "sympy", "numpy", "networkx", "jinja2", "filelock", "fsspec", "PIL", "_pytest",
            "pytest", "xdist", "execnet", "pluggy", "hypothesis", "samfast", "parity", "tests", "tinysam", "sam2",
            "sam3", "segment_anything", "open_clip", "torchvision", "torchao", "pycocotools", "matplotlib")


def installed_bytecode(source: Path) -> bool:
    """Whether the install left current bytecode beside `source` (in its __pycache__, as pip writes it)."""
    pyc = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    try:
        with pyc.open("rb") as file:
            header = file.read(12)
    except OSError:
        return False
    # an unchecked-hash or timestamp pyc: flags 0 means the header holds the source's mtime (PEP 552)
    return int.from_bytes(header[4:8], "little") == 0 and \
        int.from_bytes(header[8:12], "little") == int(source.stat().st_mtime) & 0xFFFFFFFF


def keep_in(folder: Path, env: os._Environ | dict, probe: Path | None = None) -> None:
    """Children keep their bytecode under folder/pycache (set in `env`) unless the caller chose a prefix or
    the install has its bytecode (judged by torch's __init__, or `probe`)."""
    if env.get("PYTHONPYCACHEPREFIX"):
        return
    if installed_bytecode(probe or Path(importlib.util.find_spec("torch").origin)):
        return
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")


def fill(env: os._Environ | dict, packages: tuple[str, ...] = PACKAGES) -> str:
    """Compile `packages` into env's PYTHONPYCACHEPREFIX on every core (compileall -j0: what is there and
    current is skipped, so a warm prefix costs a second or two); a line for the gate's report."""
    prefix = env.get("PYTHONPYCACHEPREFIX")
    if not prefix:
        return "Python bytecode: the installed tree's own (no PYTHONPYCACHEPREFIX)"
    roots = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            roots.append(str(Path(spec.origin).parent) if spec.submodule_search_locations else spec.origin)
    started = time.perf_counter()
    # -q: no listing; a file that fails to compile (a package's py2 test data) is the child's to meet, not the gate's
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j0", *roots], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (f"Python bytecode of every step under {prefix} (PYTHONPYCACHEPREFIX), compiled into it first for "
            f"{len(roots)} package{'s' if len(roots) != 1 else ''} in {time.perf_counter() - started:.1f} s")
