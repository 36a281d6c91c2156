"""The PR workflow (.github/workflows/parity.yml) loads, runs only nox sessions that exist, uploads what the gate writes."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is in the test extra: pip install -e .[test]")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "parity.yml"


def nox_sessions(noxfile: Path = ROOT / "noxfile.py") -> set[str]:
    """Names of the functions decorated @nox.session (or the name= they give)."""
    names = set()
    for node in ast.parse(noxfile.read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "nox.session":
                given = [k.value.value for k in deco.keywords if k.arg == "name"]
                names.add(given[0] if given else node.name)
            elif ast.unparse(deco) == "nox.session":
                names.add(node.name)
    return names


def nox_calls(text: str) -> list[str]:
    """The session of every `nox -s NAME` in a workflow's run scripts."""
    return [tokens[tokens.index("-s") + 1] for line in text.splitlines() if re.search(r"\bnox\b.*\s-s\s", line)
            for tokens in [shlex.split(line.strip())]]


def uploaded_files(workflow: dict) -> list[str]:
    paths = []
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            if str(step.get("uses", "")).startswith("actions/upload-artifact"):
                paths += [p.strip() for p in step["with"]["path"].splitlines() if p.strip()]
    return paths


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_workflow_has_a_cpu_and_a_self_hosted_gpu_job(workflow):
    assert workflow["jobs"]["cpu"]["runs-on"] == "ubuntu-latest"
    assert {"self-hosted", "gpu"} <= set(workflow["jobs"]["gpu"]["runs-on"])
    runs = {job: " ".join(s.get("run", "") for s in spec["steps"]) for job, spec in workflow["jobs"].items()}
    assert "nox -s tests" in runs["cpu"]
    assert "nox -s parity -- --require-gpu" in runs["gpu"]
    assert "--benchmark-compare-fail=mean:15%" in runs["gpu"] and "--benchmark-save=base" in runs["gpu"]
    assert "GITHUB_STEP_SUMMARY" in runs["gpu"] and "reports/gate-time.md" in runs["gpu"]


def test_every_nox_session_the_workflow_runs_exists():
    calls = nox_calls(WORKFLOW.read_text())
    assert set(calls) == {"tests", "parity"}
    assert set(calls) <= nox_sessions(), f"sessions missing from noxfile.py: {set(calls) - nox_sessions()}"


def test_the_session_check_fails_on_a_planted_unknown_session(tmp_path):
    """Planted defect: a workflow line naming a session the noxfile does not define."""
    calls = nox_calls("      - run: nox -s parity\n      - run: nox -s no-such-session -- -x\n")
    assert calls == ["parity", "no-such-session"]
    assert not set(calls) <= nox_sessions()


def test_every_uploaded_path_is_one_the_gate_writes(workflow):
    from parity.gate.run import OUTPUTS

    uploaded = uploaded_files(workflow)
    assert uploaded, "the gpu job uploads no reports"
    assert {Path(p).parent.as_posix() for p in uploaded} == {"reports"}
    assert {Path(p).name for p in uploaded} == set(OUTPUTS)


def test_the_cache_is_kept_between_runs_under_the_gates_cache_dir(workflow):
    gpu = workflow["jobs"]["gpu"]
    (cache_step,) = [s for s in gpu["steps"] if str(s.get("uses", "")).startswith("actions/cache")]
    assert gpu["env"]["SAMFAST_CACHE_DIR"].endswith("/" + cache_step["with"]["path"])
    assert "steps.cachekey.outputs.key" in cache_step["with"]["key"]
