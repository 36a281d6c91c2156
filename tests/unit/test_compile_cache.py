"""The compile cache (parity.gate.compile_cache): the key, the sealed fast path, entry-level trust after a
killed run or a corrupted entry, proved by fault injection (a kill after every filesystem change of
activate and seal) and by real CPU compiles killed with SIGKILL."""

from __future__ import annotations

import builtins
import importlib.util
import io
import json
import marshal
import os
import pickle
import py_compile
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from parity.gate import bytecode, compile_cache
from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]
KEY = {"torch": "2.11.0", "triton": "3.5.0", "cuda": "12.8", "gpu": "NVIDIA H100 80GB HBM3", "compile": "defaults"}


def _run_that_compiles(root: Path, key=KEY, seal=True) -> compile_cache.CacheFolder:
    """activate, write some 'compiled' files as inductor would, seal (or die before sealing)."""
    cache = compile_cache.activate(root, key, {})
    (cache.path / "inductor" / "fxgraph").mkdir(parents=True, exist_ok=True)
    (cache.path / "inductor" / "fxgraph" / "graph.bin").write_bytes(b"compiled graph" * 100)
    (cache.path / "triton").mkdir(exist_ok=True)
    (cache.path / "triton" / "kernel.ptx").write_bytes(b"ptx" * 100)
    if seal:
        compile_cache.seal(cache)
    else:
        compile_cache.release(cache)
    return cache


# --- the key, the folder, the environment ---------------------------------------------------------
def test_children_keep_their_bytecode_in_the_folder_even_where_the_image_forbids_writing_it(tmp_path, monkeypatch):
    """A runner image with PYTHONDONTWRITEBYTECODE and no installed bytecode made every child compile torch again."""
    monkeypatch.setattr(bytecode, "installed_bytecode", lambda source: False)  # torch installed with pip --no-compile
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": os.environ["PATH"]}
    cache = compile_cache.activate(tmp_path / "c", KEY, env)
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == str(cache.path / "pycache")
    (tmp_path / "child_module.py").write_text("X = 1\n")
    subprocess.run([sys.executable, "-c", "import child_module"], cwd=tmp_path, env=env, check=True)
    assert list((cache.path / "pycache").rglob("child_module*.pyc")), "the child wrote no bytecode under the prefix"
    assert not (tmp_path / "__pycache__").exists()  # nothing beside the source
    compile_cache.release(cache)
    mine = {"PYTHONPYCACHEPREFIX": "/mine", "PYTHONDONTWRITEBYTECODE": "1"}
    compile_cache.release(compile_cache.activate(tmp_path / "d", KEY, mine))
    assert mine["PYTHONPYCACHEPREFIX"] == "/mine" and mine["PYTHONDONTWRITEBYTECODE"] == "1"  # the caller's choice stands


def test_bytecode_the_install_has_is_used_not_hidden_by_a_prefix(tmp_path):
    """A prefix hides the installed tree's __pycache__ from every child: where pip compiled it, none is set."""
    source = tmp_path / "installed.py"
    source.write_text("X = 1\n")
    assert not bytecode.installed_bytecode(source)
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    bytecode.keep_in(tmp_path / "c", env, probe=source)
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "c" / "pycache")  # none there: the prefix
    # what pip does at install, beside the source (cfile: a PYTHONPYCACHEPREFIX of the gate's would move it)
    py_compile.compile(str(source), cfile=str(source.parent / "__pycache__" / f"installed.{sys.implementation.cache_tag}.pyc"),
                       doraise=True)
    assert bytecode.installed_bytecode(source)
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    bytecode.keep_in(tmp_path / "c", env, probe=source)
    assert env == {"PYTHONDONTWRITEBYTECODE": "1"}
    os.utime(source, (0, 12345))  # the source changed since: its bytecode is stale, the prefix again
    assert not bytecode.installed_bytecode(source)


def test_the_prefix_is_filled_before_the_children_start(tmp_path):
    """fill compiles the packages into the prefix (what each child would otherwise compile for itself)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    (package / "part.py").write_text("Y = 2\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONPYCACHEPREFIX": str(tmp_path / "prefix")}
    sys.path.insert(0, str(tmp_path))
    try:
        note = bytecode.fill(env, packages=("pkg", "not_installed_anywhere"))
    finally:
        sys.path.remove(str(tmp_path))
    # the package's files, beside whatever of the standard library compileall's own interpreter wrote there
    assert {p.name.split(".")[0] for p in (tmp_path / "prefix").rglob("*.pyc") if p.parent.name == "pkg"} == {"__init__", "part"}
    assert "compiled into it first for 1 package" in note
    assert "installed tree's own" in bytecode.fill({})


def test_cache_env_points_inductor_and_triton_into_the_key_folder(tmp_path):
    env: dict = {}
    cache = compile_cache.activate(tmp_path, KEY, env)
    assert cache.owned and cache.started_empty and cache.path.parent == tmp_path
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cache.path / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(cache.path / "triton")
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    compile_cache.release(cache)


def test_cache_root_default_and_override():
    assert compile_cache.cache_root({"SAMFAST_CACHE_DIR": "/x/c"}) == Path("/x/c")
    assert compile_cache.cache_root({"XDG_CACHE_HOME": "/x/xdg"}) == Path("/x/xdg/samfast")
    assert compile_cache.cache_root({}) == Path.home() / ".cache" / "samfast"


def test_another_key_gets_another_folder():
    names = {compile_cache.key_folder_name({**KEY, field: "other"}) for field in KEY}
    assert len(names | {compile_cache.key_folder_name(KEY)}) == len(KEY) + 1


def test_the_key_names_the_compile_settings():
    plain = compile_cache.current_key({})
    assert plain["compile"] == "defaults"
    tuned = compile_cache.current_key({"SAMFAST_COMPILE_MODE": "max-autotune", "SPARSE_BACKEND": "cutlass"})
    assert tuned["compile"] == "SAMFAST_COMPILE_MODE=max-autotune SPARSE_BACKEND=cutlass"
    assert compile_cache.key_folder_name(plain) != compile_cache.key_folder_name(tuned)


def test_a_sealed_cache_is_reused_as_it_is(tmp_path, capsys):
    first = _run_that_compiles(tmp_path)
    assert not (first.path / compile_cache.IN_USE).exists()
    capsys.readouterr()
    again = compile_cache.activate(tmp_path, KEY, {})
    assert again.path == first.path and not again.started_empty
    assert (again.path / "triton" / "kernel.ptx").exists()
    assert "sealed, verified (3 files)" in capsys.readouterr().out  # the two entries and key.json
    assert (again.path / compile_cache.IN_USE).exists()  # in use until sealed
    compile_cache.release(again)


@pytest.mark.parametrize("record", ["stamp", "key.json"])
def test_a_cache_built_for_another_key_is_moved_aside(tmp_path, record, capsys):
    cache = _run_that_compiles(tmp_path, seal=record == "stamp")
    path = cache.path / (compile_cache.STAMP if record == "stamp" else compile_cache.KEY_FILE)
    written = json.loads(path.read_text())
    path.write_text(json.dumps({**written, "key": {**KEY, "torch": "2.10"}} if record == "stamp" else {**KEY, "torch": "2.10"}))
    again = compile_cache.activate(tmp_path, KEY, {})
    assert again.started_empty and not (again.path / "triton" / "kernel.ptx").exists()
    assert (tmp_path / f"{again.path.name}.stale-0" / "triton" / "kernel.ptx").exists()  # kept for a post-mortem
    assert "cold (built for another key" in capsys.readouterr().out
    compile_cache.release(again)


def test_a_cache_in_use_by_another_run_is_shared_not_moved(tmp_path):
    owner = compile_cache.activate(tmp_path, KEY, {})
    (owner.path / "inductor").mkdir()
    (owner.path / "inductor" / ".1.2.tmp").write_bytes(b"x")  # the owner's compile, half written
    second = compile_cache.activate(tmp_path, KEY, {})  # the owner holds the lock
    assert not second.owned and (owner.path / "inductor" / ".1.2.tmp").exists()
    compile_cache.seal(second)  # not the owner: no stamp
    assert not (owner.path / compile_cache.STAMP).exists()
    compile_cache.seal(owner)
    assert compile_cache.why_untrusted(owner.path, KEY) is not None  # its temporary is not vouched for
    assert ".1.2.tmp" not in json.dumps(compile_cache.read_stamp(owner.path))
    compile_cache.release(second)


def test_a_run_that_outlives_its_owner_keeps_the_entries_it_is_writing(tmp_path, capsys):
    """Two runs at once, the owner ending first: a third run that starts meanwhile owns the folder (and seals
    it) but does not validate it, since the second still writes there (a validation then dropped 989 entries
    of a CI run beside a developer's test run); once the second has ended, the next owner does."""
    first = compile_cache.activate(tmp_path, KEY, {})
    second = compile_cache.activate(tmp_path, KEY, {})
    compile_cache.seal(first)  # the first run ends
    writing = killed_run_leftovers()["failing"]  # what a compile in flight looks like: entries not whole yet
    write(second.path, writing)
    capsys.readouterr()
    third = compile_cache.activate(tmp_path, KEY, {})
    assert third.owned and "without validating it" in capsys.readouterr().out
    assert set(writing) <= set(on_disk(third.path))
    compile_cache.release(third)
    compile_cache.release(second)  # the second run ends
    fourth = compile_cache.activate(tmp_path, KEY, {})  # alone: validates, and what never became whole goes
    assert fourth.owned and not set(writing) & set(on_disk(fourth.path))
    assert f"dropped {len(writing)}" in capsys.readouterr().out
    compile_cache.release(fourth)


# --- entries: what a killed run leaves, what corruption does ---------------------------------------
def elf_bytes() -> bytes:
    """A real shared library, as the compiler leaves one."""
    return min(Path(sysconfig.get_config_var("DESTSHARED")).glob("*.so"), key=lambda p: p.stat().st_size).read_bytes()


def pyc_bytes(source: str) -> bytes:
    return importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(compile(source, "m.py", "exec"))


def triton_kernel(name: str, with_group=True, listed=("cubin", "json")) -> dict[str, bytes]:
    """A Triton kernel folder: its files, then (as Triton writes it last) the group naming them by absolute path."""
    files = {f"triton/{name}/k.cubin": elf_bytes(), f"triton/{name}/k.json": b'{"name": "k"}'}
    if with_group:
        group = {"child_paths": {f"k.{ext}": f"/elsewhere/triton/{name}/k.{ext}" for ext in listed}}
        files[f"triton/{name}/__grp__k.json"] = json.dumps(group).encode()
    return files


def good_entries(tag: str) -> dict[str, bytes]:
    """One whole entry of every kind inductor, Triton and Python write."""
    return {
        f"inductor/fxgraph/ab/f{tag}/entry": pickle.dumps({"code": "graph " * 50, "tag": tag}),
        f"inductor/aotautograd/a{tag}/entry": pickle.dumps({"forward": tag}),
        f"inductor/ab/c{tag}.so": elf_bytes(),
        f"inductor/ab/c{tag}.so.load_ok": b"",
        f"inductor/ab/c{tag}.cpp": b"extern \"C\" void kernel() {}\n",
        f"inductor/cd/c{tag}.py": b"def call(args):\n    return args\n",
        f"inductor/cd/c{tag}.best_config": b'{"XBLOCK": 8}',
        f"inductor/locks/c{tag}.lock": b"",
        f"pycache/m{tag}.cpython-311.pyc": pyc_bytes(f"X = {tag!r}\n"),
        f"triton/launcher{tag}/cuda_utils.so": elf_bytes(),
        **triton_kernel(f"kernel{tag}"),
    }


def killed_run_leftovers() -> dict[str, bytes]:
    """What a run killed mid-compile leaves besides its finished entries: {path: bytes}, by how the check drops it."""
    elf, graph = elf_bytes(), pickle.dumps({"code": "graph " * 50})
    temporaries = {
        "inductor/ef/.4242.139.tmp": graph[:40],  # write_atomic's, before its rename
        "triton/kernelT/tmp.pid_4242_0b1c-2d/k.cubin": elf[:100],  # Triton's put, before its os.replace
        "pycache/n.cpython-311.pyc.139872": b"\xa7\r",  # importlib's, before its rename
        ".stamp.json.4242.tmp": b'{"key"',  # a seal killed before its rename
    }
    incomplete_kernels = {**triton_kernel("nogroup", with_group=False),
                          **triton_kernel("halfgroup", listed=("cubin", "json", "ptx"))}  # the .ptx never came
    failing = {
        "inductor/gh/cgh.so": elf[: len(elf) // 2],  # the compiler killed while writing it
        "inductor/gh/cgh.so.load_ok": b"",  # goes with its library
        "inductor/fxgraph/zz/fz/entry": graph[:-7],
        "inductor/ij/cij.py": b"def call(args:\n",
        "inductor/ij/cij.best_config": b'{"XBLOCK": ',
        "pycache/bad.cpython-311.pyc": b"\0\0\0\0" + bytes(12) + marshal.dumps(compile("X = 1", "m.py", "exec")),
        "triton/launcherbad/cuda_utils.so": b"\x7fELF" + bytes(60),
    }
    return {"temporaries": temporaries, "incomplete kernels": incomplete_kernels, "failing": failing}


def write(folder: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)


def on_disk(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name not in compile_cache.BOOKKEEPING}


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def sealed_then_killed(root: Path) -> tuple[Path, dict[str, bytes], set[str]]:
    """A sealed run's entries, then a run killed mid-compile: its finished entries, its leftovers and two of the
    sealed entries corrupted. Returns the folder, the good files (path: bytes) and the bad paths."""
    cache = compile_cache.activate(root, KEY, {})
    write(cache.path, good_entries("1"))
    compile_cache.seal(cache)
    killed = compile_cache.activate(root, KEY, {})
    leftovers = killed_run_leftovers()
    write(killed.path, good_entries("2") | {p: d for group in leftovers.values() for p, d in group.items()})
    flip_a_byte(killed.path / "inductor/fxgraph/ab/f1/entry")  # still a pickle: only the stamp's sha256 sees it
    (killed.path / "inductor/cd/c1.py").write_bytes(b"def call(ar")
    compile_cache.release(killed)  # killed: no seal, the in-use marker stays
    bad = {p for group in leftovers.values() for p in group} | {"inductor/fxgraph/ab/f1/entry", "inductor/cd/c1.py"}
    good = {p: d for p, d in on_disk(killed.path).items() if p not in bad}
    return killed.path, good, bad


def test_a_killed_run_keeps_its_finished_entries_and_drops_the_rest(tmp_path, capsys):
    folder, good, bad = sealed_then_killed(tmp_path)
    assert len(good) == 2 * len(good_entries("1")) - 1  # two runs' entries and key.json, less the two corrupted
    capsys.readouterr()
    again = compile_cache.activate(tmp_path, KEY, {})
    line = capsys.readouterr().out
    assert on_disk(folder) == good and not again.started_empty
    assert (f"resumed an unfinished run's entries: kept {len(good)} files, dropped {len(bad)} "
            f"(4 temporaries, 5 in 2 incomplete Triton kernels, 9 failed validation)") in line, line
    assert not list(folder.rglob("tmp.pid_*")), "Triton's temporary folder is left"
    compile_cache.seal(again)
    capsys.readouterr()
    compile_cache.release(compile_cache.activate(tmp_path, KEY, {}))
    assert f"sealed, verified ({len(good)} files)" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["truncate", "flip_a_byte", "delete"])
@pytest.mark.parametrize("entry", ["inductor/fxgraph/ab/f1/entry", "inductor/ab/c1.so", "triton/kernel1/k.cubin",
                                   "pycache/m1.cpython-311.pyc"])
def test_a_corrupted_entry_of_a_sealed_cache_is_dropped_and_the_rest_kept(tmp_path, damage, entry, capsys):
    cache = compile_cache.activate(tmp_path, KEY, {})
    write(cache.path, good_entries("1"))
    compile_cache.seal(cache)
    sealed = on_disk(cache.path)
    path = cache.path / entry
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    elif damage == "flip_a_byte":
        flip_a_byte(path)
    else:
        path.unlink()
    capsys.readouterr()
    again = compile_cache.activate(tmp_path, KEY, {})
    assert "files changed since the stamp" in capsys.readouterr().out
    # what goes with the entry: its kernel's other files (the group names a missing one), the library's load_ok marker
    goes_with = {"triton/kernel1/k.cubin": {"triton/kernel1/k.json", "triton/kernel1/__grp__k.json"},
                 "inductor/ab/c1.so": {"inductor/ab/c1.so.load_ok"}}.get(entry, set())
    assert on_disk(again.path) == {p: d for p, d in sealed.items() if p != entry and p not in goes_with}
    compile_cache.release(again)


def test_a_file_added_to_a_sealed_cache_is_kept_only_when_whole(tmp_path, capsys):
    cache = _run_that_compiles(tmp_path)
    stray = {"inductor/stray.so": b"?", "inductor/fxgraph/ab/fstray/entry": pickle.dumps({"code": "graph"})}
    write(cache.path, stray)
    capsys.readouterr()
    again = compile_cache.activate(tmp_path, KEY, {})
    assert "kept 4 files, dropped 1 (0 temporaries, 0 in 0 incomplete Triton kernels, 1 failed validation)" \
        in capsys.readouterr().out
    assert "inductor/stray.so" not in on_disk(again.path) and "inductor/fxgraph/ab/fstray/entry" in on_disk(again.path)
    compile_cache.release(again)


def test_a_garbage_stamp_costs_the_checks_not_the_entries(tmp_path, capsys):
    cache = _run_that_compiles(tmp_path)
    (cache.path / compile_cache.STAMP).write_bytes(b"\x00not json")
    capsys.readouterr()
    again = compile_cache.activate(tmp_path, KEY, {})
    assert "kept 3 files, dropped 0" in capsys.readouterr().out and not again.started_empty
    compile_cache.release(again)


# --- fault injection: a kill after every filesystem change of activate() and seal() ----------------
class Killed(BaseException):
    """kill -9 at this point: no except clause catches it, nothing after it runs."""


class KillAfter:
    """Patches the os and io functions that change the filesystem so that the n-th change made by
    compile_cache (while not paused) is the last: Killed is raised right after it."""

    CHANGES = ("mkdir", "rmdir", "unlink", "remove", "rename", "replace")

    def __init__(self, n: int, monkeypatch):
        self.n, self.changes, self.paused = n, 0, False
        for name in self.CHANGES:
            monkeypatch.setattr(os, name, self._counted(getattr(os, name)))
        opened = self._counted(io.open, writes=lambda file, mode="r", *args, **kwargs: any(c in mode for c in "wax+"))
        monkeypatch.setattr(io, "open", opened)
        monkeypatch.setattr(builtins, "open", opened)

    def _counted(self, real, writes=lambda *args, **kwargs: True):
        def change(*args, **kwargs):
            result = real(*args, **kwargs)
            if not self.paused and writes(*args, **kwargs):
                self.changes += 1
                if self.changes == self.n:
                    raise Killed(f"after change {self.n}: {real.__name__}{args}")
            return result
        return change


def die() -> None:
    """What the kernel does for a killed process: its flock goes."""
    for handle in compile_cache._open_locks:
        handle.close()
    compile_cache._open_locks.clear()


@pytest.mark.parametrize("start", ["after a killed run", "sealed"])
def test_a_kill_between_any_two_filesystem_changes_of_activate_and_seal(tmp_path, monkeypatch, start):
    """For every n: a run (activate, compile one entry, seal) killed after its n-th filesystem change; the
    next activate must keep every good file, the entry if it was written, and nothing bad. Until a run
    completes with no kill."""
    template = tmp_path / "template"
    if start == "sealed":
        cache = compile_cache.activate(template, KEY, {})
        write(cache.path, good_entries("1"))
        compile_cache.seal(cache)
        good, bad = on_disk(cache.path), set()
    else:
        _, good, bad = sealed_then_killed(template)
    new_entry = good_entries("3")
    n = 0
    while True:
        n += 1
        root = tmp_path / f"run{n}"
        shutil.copytree(template, root)
        with monkeypatch.context() as patch:
            kill = KillAfter(n, patch)
            try:
                cache = compile_cache.activate(root, KEY, {})
                kill.paused = True  # the compile itself (its own writes are inductor's to make atomic)
                write(cache.path, new_entry)
                kill.paused = False
                compile_cache.seal(cache)
                completed = True
            except Killed:
                completed = False
        die()
        after = compile_cache.activate(root, KEY, {})
        files = on_disk(after.path)
        compile_cache.release(after)
        assert {p: files.get(p) for p in good} == good, f"kill after change {n}: a good file was lost or changed"
        assert not bad & set(files), f"kill after change {n}: kept {sorted(bad & set(files))}"
        assert set(files) <= set(good) | set(new_entry), f"kill after change {n}: {sorted(set(files) - set(good) - set(new_entry))}"
        assert all(files[p] == d for p, d in new_entry.items() if p in files)
        if completed:
            break
    assert n > 5, f"only {n - 1} changes to inject a kill after"
    print(f"{start}: a kill injected after each of {n - 1} filesystem changes")


# --- real compiles on the CPU, killed with SIGKILL ---------------------------------------------------
CHILD = """
import json, sys, time
from parity.gate import compile_cache
cache = compile_cache.activate()   # before torch compiles anything, as the gate does
import torch
from torch._dynamo.utils import counters
functions = [lambda x: torch.sin(x) * 2 + x.cos(), lambda x: torch.relu(x @ x.T).sum(1), lambda x: torch.softmax(x * 3, -1)]
x = torch.arange(64, dtype=torch.float32).reshape(8, 8) / 64
for i, f in enumerate(functions):
    before = dict(counters["inductor"])
    started = time.perf_counter()
    y = torch.compile(f)(x)
    seconds = time.perf_counter() - started
    torch.testing.assert_close(y, f(x))  # compiled equals eager
    delta = {k: counters["inductor"][k] - before.get(k, 0) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}
    print(json.dumps({"function": i, **delta, "seconds": round(seconds, 2), "result": y.flatten().tolist()}), flush=True)
compile_cache.seal(cache)
print("sealed", flush=True)
"""


def compile_in_child(root: Path, kill_after: int | None = None) -> tuple[list[str], list[dict], str]:
    """Run CHILD with its cache under root; SIGKILL its process group once `kill_after` functions have printed.
    Returns the activate line, one record per finished function, and stderr."""
    env = child_env(SAMFAST_CACHE_DIR=str(root), TORCHINDUCTOR_VEC_ISA_OK="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    for name in (compile_cache.ENV_ACTIVE, "SAMFAST_COMPILE_MODE", "PYTHONPYCACHEPREFIX"):
        env.pop(name, None)
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines, records = [], []
    for line in child.stdout:
        lines.append(line.strip())
        if line.startswith("{"):
            records.append(json.loads(line))
            if len(records) == kill_after:
                os.killpg(child.pid, signal.SIGKILL)
                break
    child.wait(timeout=600)
    stderr = child.stderr.read()
    assert child.returncode == (-signal.SIGKILL if kill_after else 0), "\n".join(lines) + stderr
    return [line for line in lines if line.startswith("compile cache")], records, stderr


# the two tests below share the fixture's four compiling processes: under xdist, on one worker, not each on its own
ON_ONE_WORKER = pytest.mark.xdist_group("compile-cache-killed-runs")


@pytest.fixture(scope="module")
def killed_twice_then_finished(tmp_path_factory):
    """One cache: a cold run killed after 1 function, a run killed after 2, a run that finishes and seals."""
    root = tmp_path_factory.mktemp("killed")
    return root, [compile_in_child(root, kill_after=1), compile_in_child(root, kill_after=2), compile_in_child(root)]


@pytest.mark.slow(reason="three child processes, each importing torch and compiling with inductor's C++ compiler")
@ON_ONE_WORKER
def test_a_compile_killed_with_sigkill_keeps_what_it_finished(killed_twice_then_finished):
    _, runs = killed_twice_then_finished
    (first, first_records, _), (second, second_records, _), (third, third_records, _) = runs
    assert "cold (empty)" in first[0]
    assert "resumed an unfinished run's entries" in second[0] and "resumed an unfinished run's entries" in third[0]
    # the second run reuses what the first finished, the third what the first two did
    assert second_records[0]["fxgraph_cache_hit"] >= 1 and second_records[0]["fxgraph_cache_miss"] == 0
    assert all(r["fxgraph_cache_hit"] >= 1 and r["fxgraph_cache_miss"] == 0 for r in third_records[:2])
    assert [r["result"] for r in third_records[:2]] == [r["result"] for r in second_records] \
        and third_records[0]["result"] == first_records[0]["result"]  # the same results (each also equals eager)
    print("compile seconds per function, by run:", [[r["seconds"] for r in run[1]] for run in runs], *second, *third, sep="\n")


@pytest.mark.slow
@ON_ONE_WORKER
def test_a_corrupted_compiled_entry_is_rebuilt_not_read(killed_twice_then_finished, tmp_path):
    """A truncated .so and an FX-graph entry with a flipped byte, in a sealed folder of real compiles."""
    source, runs = killed_twice_then_finished
    root = tmp_path / "cache"
    shutil.copytree(source, root)
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    libraries = sorted(p.relative_to(folder) for p in (folder / "inductor").rglob("*.so"))
    library = folder / libraries[0]
    library.write_bytes(library.read_bytes()[:1000])
    # inductor marks some libraries loaded with a <name>.so.load_ok file, which goes with its library
    dropped = 2 + library.with_name(library.name + ".load_ok").exists()
    graph = min((folder / "inductor" / "fxgraph").rglob("*/*/*"), key=lambda p: p.name)
    flip_a_byte(graph)
    line, records, stderr = compile_in_child(root)
    assert "files changed since the stamp" in line[0] and f"dropped {dropped} (0 temporaries, 0 in 0 incomplete " \
        f"Triton kernels, {dropped} failed validation)" in line[0], line
    assert "unable to load" not in stderr  # the torn graph was never read
    # the function whose graph went is compiled again (a miss per cached candidate it tried), the others load whole
    assert sorted(r["fxgraph_cache_hit"] > 0 and r["fxgraph_cache_miss"] == 0 for r in records) == [False, True, True]
    assert [r["result"] for r in records] == [r["result"] for r in runs[2][1]]
    assert sorted(p.relative_to(folder) for p in (folder / "inductor").rglob("*.so")) == libraries
    assert compile_cache.elf_is_whole(library)  # rebuilt
