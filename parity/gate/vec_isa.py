"""Inductor's CPU vector-ISA probe, run once per compile-cache folder instead of once per process.

Before its first CPU kernel, every process in which inductor compiles checks which vector ISAs
(AVX2, AVX-512, AMX) the C++ compiler can build and the process can load: it builds a test program
per ISA (kept in the inductor cache) and, in torch 2.11, starts a Python child per ISA that imports
torch to dlopen it, every time. On the H100 runner that was ~36 s (cProfile) of the ~58 s a CPU
compile check's first test took beyond the same test run second in its process, and every xdist worker that
compiles for the CPU paid it. In the whole gate it cut the CPU compile checks' test-seconds by ~11%
without moving the warm wall, which other load sets (docs/gpu-gate.md, the runs with perf early and the ISA probe, commit adb5303).

`settle` probes once with torch's own check and keeps the verdict in the cache folder
(vec-isa.json, sealed and validated with the rest). When every ISA the CPU reports passed the
probe, it sets TORCHINDUCTOR_VEC_ISA_OK=1 for this process and its children: inductor then trusts
the CPU's flags, which picks the very ISA the probe would have, without probing. When none passed
(the H100 runner: its CPU reports AVX2, whose probe failed), it sets TORCHINDUCTOR_VEC_ISA_OK=0,
which makes inductor take every ISA as unusable: the probe's verdict again, without probing. When
only some failed (a compiler without AVX-512 support, say), nothing is set and every process probes
as before. The verdict is keyed by torch, the CPU's flags and the compiler, so a cache restored on
another machine is probed again. A TORCHINDUCTOR_VEC_ISA_OK the user set is left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

RECORD = "vec-isa.json"
ENV = "TORCHINDUCTOR_VEC_ISA_OK"


def machine_fingerprint() -> str:
    """What the probe's verdict depends on: torch, the CPU (architecture and flags) and the C++ compiler."""
    import torch
    from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

    try:
        cpu_flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith(("flags", "Features"))), "")
    except OSError:
        cpu_flags = platform.processor()
    compiler = get_cpp_compiler()
    parts = [torch.__version__, platform.machine(), cpu_flags, compiler, get_compiler_version_info(compiler)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def probe() -> dict[str, list[str]]:
    """The ISAs inductor finds usable by building and loading them ("probed"), and those it would take
    on the CPU's word alone ("claimed", what TORCHINDUCTOR_VEC_ISA_OK=1 gives), best first."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    with config.patch({"cpp.vec_isa_ok": None}):  # a real build-and-load check, whatever the environment says
        probed = [str(isa) for isa in valid_vec_isa_list.__wrapped__()]  # the uncached function: a fresh check
    with config.patch({"cpp.vec_isa_ok": True}):
        claimed = [str(isa) for isa in valid_vec_isa_list.__wrapped__()]
    return {"probed": probed, "claimed": claimed}


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
        return record if isinstance(record.get("fingerprint"), str) and isinstance(record.get("probed"), list) \
            and isinstance(record.get("claimed"), list) else None
    except (OSError, ValueError, AttributeError):
        return None


def settle(folder: Path, may_write: bool, env: os._Environ | dict = os.environ,
           run_probe: Callable[[], dict] = probe, fingerprint: Callable[[], str] = machine_fingerprint) -> str:
    """Probe once per folder and machine (only the folder's owner writes the verdict); set ENV in `env`
    when the probe and the CPU's flags agree. Returns a line for the gate's notes."""
    if ENV in env:
        return f"CPU vector ISA: {ENV}={env[ENV]} as set by the caller"
    try:
        mine = fingerprint()
        record = _read(folder / RECORD)
        if record is None or record["fingerprint"] != mine:
            if not may_write:
                return "CPU vector ISA: no verdict for this machine in a cache another run owns; each process probes"
            record = {"fingerprint": mine, **run_probe()}
            # a plain write: the folder is trusted only once sealed after the run, and a torn record reads as none
            (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    except Exception as err:  # an inductor without these helpers: leave the per-process probe as it is
        return f"CPU vector ISA: not settled ({type(err).__name__}: {err}); each process probes"
    best = record["probed"][0] if record["probed"] else "none"
    if not record["probed"]:
        # No ISA builds and loads (the H100 runner: AVX2 claimed, its probe failed): 0 makes inductor
        # take every ISA as unusable, exactly the probe's verdict, without a process probing again.
        env[ENV] = "0"
        return f"CPU vector ISA: none usable (probed once for this cache: {record['claimed'] or 'none'} failed; {ENV}=0 for every step)"
    if record["probed"] != record["claimed"]:
        return (f"CPU vector ISA: {best}; the CPU also reports {sorted(set(record['claimed']) - set(record['probed']))}, "
                "which failed the probe, so each process probes")
    env[ENV] = "1"
    return f"CPU vector ISA: {best} (probed once for this cache; {ENV}=1 for every step)"
