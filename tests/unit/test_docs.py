"""Every command the docs show runs, every file they link exists, and the README stays short.

Covered: README.md and every docs/**/*.md, so a page added later is checked without touching this
file. In their fenced ```bash blocks, each command that starts with `python -m X` must answer
`python -m X --help` (and a subcommand it names, `python -m parity check`, must be one X's usage
lists); each `nox -s Y` must name a session of noxfile.py. Commands whose --help cannot run on a
CPU are marked GPU, either by a trailing `# GPU` comment on the line (`# GPU: why` works too) or
by a `<!-- gpu -->` line just before the block; for those only the module's existence is checked.

Outside docs/history, no file of the tree (page, docstring, comment, error message) cites a numbered
work period or an issue number: a reader has neither, so a citation names a commit, a page or a test.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_LIMIT = 8000  # bytes, as `wc -c README.md` counts them

FENCE = re.compile(r"^\s*```")
GPU_BLOCK = "<!-- gpu -->"
GPU_LINE = re.compile(r"#\s*GPU\b")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|(?:src|href)=\"([^\"]+)\"")
INLINE_CODE = re.compile(r"`[^`\n]*`")
WORK_PERIOD = re.compile(r"\bsessions?[- ]\d+", re.IGNORECASE)
ISSUE_NUMBER = re.compile(r"\bissues? \d+", re.IGNORECASE)  # "sam2 issue #517" names another repository's
HISTORY = "docs/history"  # measurement narratives, keyed by date and commit, may say which period they came from
# Never read for citations: git's own folder and what a run leaves behind (reports, caches, environments).
NOT_THE_TREE = {".git", ".nox", ".venv", "venv", "__pycache__", "reports", ".pytest_cache", "shared", ".device"}


@dataclass(frozen=True)
class Command:
    doc: str  # path relative to the repository, e.g. docs/gate.md
    line: int
    text: str
    tool: str  # "python -m" or "nox -s"
    target: str  # the module or the session
    subcommand: str | None  # the word after the module, when it is not an option
    gpu: bool


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _logical_lines(block: list[tuple[int, str]]):
    """Lines of a shell block with backslash continuations joined, each with its first line number."""
    pending, start = "", 0
    for number, text in block:
        start = start or number
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1] + " "
            continue
        yield start, pending + text
        pending, start = "", 0
    if pending:
        yield start, pending


def commands_in(doc: Path, root: Path) -> list[Command]:
    lines = doc.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = lines[index].strip()
        index += 1
        if not FENCE.match(opening):
            continue
        before = next((lines[i].strip() for i in range(index - 2, -1, -1) if lines[i].strip()), "")
        block = []
        while index < len(lines) and not FENCE.match(lines[index]):
            block.append((index + 1, lines[index]))
            index += 1
        index += 1  # the closing fence
        if opening.strip("`").strip() not in ("bash", "sh", "shell"):
            continue
        for number, text in _logical_lines(block):
            gpu = before == GPU_BLOCK or bool(GPU_LINE.search(text))
            found += _commands_of_line(doc.relative_to(root).as_posix(), number, text, gpu)
    return found


def _commands_of_line(doc: str, number: int, text: str, gpu: bool) -> list[Command]:
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as err:
        pytest.fail(f"{doc}:{number}: the shell line does not parse ({err}): {text}")
    commands, current = [], []
    for token in [*tokens, ";"]:
        if token not in ("&&", "||", ";", "|"):
            current.append(token)
            continue
        while current and ENV_ASSIGNMENT.match(current[0]):
            current.pop(0)
        if current[:2] in (["python", "-m"], ["python3", "-m"], ["nox", "-s"]) and len(current) > 2:
            tool = "nox -s" if current[0] == "nox" else "python -m"
            rest = current[3:]
            sub = rest[0] if tool == "python -m" and rest and not rest[0].startswith("-") else None
            commands.append(Command(doc, number, " ".join(current), tool, current[2], sub, gpu))
        current = []
    return commands


def nox_sessions(noxfile: Path) -> set[str]:
    """Session names of a noxfile, read with ast: @nox.session(name=...) or the function's name."""
    names = set()
    for node in ast.walk(ast.parse(noxfile.read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            func = call.func if call else decorator
            if isinstance(func, ast.Attribute) and func.attr == "session":
                given = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
                names.add(given[0] if given else node.name)
    return names


HELP_RUNNER = """
import contextlib, io, json, runpy, sys, traceback
results = {}
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        code, out = 1, io.StringIO(out.getvalue() + traceback.format_exc())
    results[module] = [code, out.getvalue()]
print("HELP-RESULTS " + json.dumps(results))
"""


def help_outputs(modules: list[str], root: Path) -> dict[str, tuple[int, str]]:
    """{module: (exit code, output)} of `python -m module --help`, all in one interpreter (torch loads once)."""
    if not modules:
        return {}
    result = subprocess.run([sys.executable, "-c", HELP_RUNNER, *modules], cwd=root, capture_output=True,
                            text=True, timeout=600)
    marker = [line for line in result.stdout.splitlines() if line.startswith("HELP-RESULTS ")]
    assert marker, f"the --help runner died:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return {name: tuple(value) for name, value in json.loads(marker[-1].removeprefix("HELP-RESULTS ")).items()}


def subcommands(help_text: str) -> set[str] | None:
    """The choices an argparse usage line lists ({golden,check}), or None when it lists none."""
    usage = help_text.split("\n\n")[0]
    choices = re.search(r"\{([\w,.-]+)\}", usage)
    return set(choices.group(1).split(",")) if choices else None


def command_problem(command: Command, helps: dict, sessions: set[str]) -> str | None:
    where = f"{command.doc}:{command.line}: `{command.text}`"
    if command.tool == "nox -s":
        if command.target not in sessions:
            return f"{where}: no nox session {command.target!r} (noxfile.py has {', '.join(sorted(sessions))})"
        return None
    if command.gpu:
        if importlib.util.find_spec(command.target) is None:
            return f"{where}: no module {command.target!r}"
        return None
    code, output = helps[command.target]
    if code != 0:
        return (f"{where}: `python -m {command.target} --help` exited {code} (mark the line `# GPU` if it "
                f"cannot run on a CPU):\n{output[-2000:]}")
    choices = subcommands(output)
    if command.subcommand and choices is not None and command.subcommand not in choices:
        return f"{where}: {command.target} has no subcommand {command.subcommand!r} (it has {', '.join(sorted(choices))})"
    return None


def broken_links(doc: Path, root: Path) -> list[str]:
    """'doc:line: target' for each relative link (outside code) to a file that does not exist."""
    problems, in_code = [], False
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = (match.group(1) or match.group(2)).split("#")[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # an anchor or a URL
                continue
            if not (doc.parent / target).exists():
                problems.append(f"{doc.relative_to(root).as_posix()}:{number}: {target} does not exist")
    return problems


def tree_files(root: Path) -> list[Path]:
    """The files of the tree: git's tracked and untracked-but-not-ignored ones, or, outside a git
    checkout (a copy of the tree), every file below root but those NOT_THE_TREE names."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True)
    if listed.returncode == 0 and (root / ".git").exists():
        return sorted(root / name for name in listed.stdout.decode().split("\0") if name)
    return sorted(path for path in root.rglob("*")
                  if path.is_file() and not NOT_THE_TREE & set(path.relative_to(root).parts[:-1]))


def history_citations(root: Path) -> list[str]:
    """'path:line: text' for each numbered work period or issue number cited outside docs/history."""
    found = []
    for path in tree_files(root):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(HISTORY + "/") or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # a binary file (pictures, goldens, weights)
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            for match in (*WORK_PERIOD.finditer(line), *ISSUE_NUMBER.finditer(line)):
                found.append(f"{relative}:{number}: {match.group(0)!r} in: {line.strip()[:120]}")
    return found


COMMANDS = [c for doc in doc_files(REPO) for c in commands_in(doc, REPO)]


@pytest.fixture(scope="module")
def helps():
    return help_outputs(sorted({c.target for c in COMMANDS if c.tool == "python -m" and not c.gpu}), REPO)


def test_docs_show_commands():
    """The README's two commands at least: a parser that finds nothing would pass everything below."""
    readme = {c.text for c in COMMANDS if c.doc == "README.md"}
    assert {"nox -s parity", "nox -s tests"} <= readme


# One worker under --dist loadgroup (the gate's): `helps` starts an interpreter that imports torch and
# every documented module, and each worker running one of these tests built it again (8 workers on the
# H100 runner: ~13 s each, 170 test-seconds for this file).
@pytest.mark.xdist_group("docs-commands")
@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.doc}:{c.line}:{c.tool}:{c.target}" for c in COMMANDS])
def test_command_runs(command, helps):
    assert command_problem(command, helps, nox_sessions(REPO / "noxfile.py")) is None


@pytest.mark.parametrize("doc", doc_files(REPO), ids=lambda d: d.relative_to(REPO).as_posix())
def test_links_point_at_files(doc):
    assert broken_links(doc, REPO) == []


def test_readme_is_short():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes (limit {README_LIMIT}): move detail to a docs/ page"


def test_no_work_periods_or_issue_numbers_outside_history():
    citations = history_citations(REPO)
    assert not citations, ("name a commit, a docs page or a test instead (a reader has no work periods and no "
                           f"issue tracker; docs/history may keep them):\n" + "\n".join(citations))


# Planted defects: each checker above fails on a doc that is wrong.

PLANTED_DOC = """# A page

See [the gate](gate.md), [a missing page](nowhere.md#part), [the web](https://example.com),
[a section](#a-page) and ![a missing picture](pics/none.png). `[not a link](missing.md)`

```bash
pip install nox && nox -s no-such-session -- --fast
SAMFAST_DATA=/d python -m samfast_no_such_module check \\
    --long
python -m gpu_only_module --go        # GPU: needs CUDA
```

```python
import os  # python -m not_a_shell_command
```

<!-- gpu -->
```bash
python -m json.tool --no-such-flag
```
"""


@pytest.fixture
def planted(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[docs](docs/page.md)\n")
    (tmp_path / "docs" / "gate.md").write_text("# gate\n")
    (tmp_path / "docs" / "page.md").write_text(PLANTED_DOC)
    (tmp_path / "noxfile.py").write_text(
        "import nox\n\n@nox.session(python=False)\ndef tests(session): ...\n\n"
        "@nox.session(name='train-tiny', python=False)\ndef train_tiny(session): ...\n"
    )
    return tmp_path


def test_planted_commands_are_parsed_with_their_gpu_marks(planted):
    found = commands_in(planted / "docs" / "page.md", planted)
    assert [(c.line, c.tool, c.target, c.subcommand, c.gpu) for c in found] == [
        (7, "nox -s", "no-such-session", None, False),
        (8, "python -m", "samfast_no_such_module", "check", False),
        (10, "python -m", "gpu_only_module", None, True),
        (19, "python -m", "json.tool", None, True),
    ]
    assert doc_files(planted) == [planted / "README.md", planted / "docs" / "gate.md", planted / "docs" / "page.md"]


def test_planted_bad_commands_fail(planted):
    found = commands_in(planted / "docs" / "page.md", planted)
    sessions = nox_sessions(planted / "noxfile.py")
    assert sessions == {"tests", "train-tiny"}
    helps = help_outputs(["samfast_no_such_module"], planted)
    problems = [command_problem(c, helps, sessions) for c in found]
    assert "no nox session 'no-such-session'" in problems[0]
    assert "`python -m samfast_no_such_module --help` exited 1" in problems[1]
    assert "No module named samfast_no_such_module" in problems[1]
    assert "no module 'gpu_only_module'" in problems[2]
    assert problems[3] is None  # GPU-marked and the module exists: its --help is not run


def test_planted_help_and_subcommands(tmp_path):
    """A module whose --help works passes; a subcommand missing from its usage line fails."""
    helps = help_outputs(["json.tool"], tmp_path)
    assert helps["json.tool"][0] == 0
    command = Command("docs/x.md", 1, "python -m json.tool", "python -m", "json.tool", None, False)
    assert command_problem(command, helps, set()) is None
    fake = {"parity": (0, "usage: python -m parity [-h] {golden,check} ...\n\noptions:\n  {yes,no}\n")}
    wrong = Command("docs/x.md", 2, "python -m parity chek", "python -m", "parity", "chek", False)
    assert "has no subcommand 'chek' (it has check, golden)" in command_problem(wrong, fake, set())
    right = Command("docs/x.md", 3, "python -m parity check", "python -m", "parity", "check", False)
    assert command_problem(right, fake, set()) is None


def test_planted_broken_links_fail(planted):
    assert broken_links(planted / "docs" / "page.md", planted) == [
        "docs/page.md:3: nowhere.md does not exist",
        "docs/page.md:4: pics/none.png does not exist",
    ]
    assert broken_links(planted / "README.md", planted) == []


def test_planted_work_periods_and_issue_numbers_are_found(tmp_path):
    """A docstring, a page and an error message each cite one; docs/history and a binary file may."""
    # spelled apart: this file is in the tree it checks
    period, periods, issue = "sess" + "ion 38", "Sess" + "ions 43-49", "iss" + "ue 37"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(f'"""Measured in {periods}."""\n'
                                             f'raise ValueError("not built yet ({issue})")\n')
    (tmp_path / "docs" / "history").mkdir(parents=True)
    (tmp_path / "docs" / "page.md").write_text(f"# A page\n\nAs the {period.replace(' ', '-')} profile showed.\n"
                                              "sam2 issue #517 is another repository's; a session of 17 frames.\n")
    (tmp_path / "docs" / "history" / "speed.md").write_text(f"## 2026-11-28, 58d69dc ({period})\n")
    (tmp_path / "docs" / "picture.png").write_bytes(b"\x89PNG\0" + period.encode())
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "report.md").write_text(f"left by a run: {period}\n")
    assert [c.split(" in: ")[0] for c in history_citations(tmp_path)] == [
        f"docs/page.md:3: {period.replace(' ', '-')!r}",
        f"pkg/mod.py:1: {periods[:-3]!r}",
        f"pkg/mod.py:2: {issue!r}",
    ]
