"""The PR workflow (.github/workflows/parity.yml) loads, runs only nox sessions that exist, uploads what the gate writes."""

from __future__ import annotations

import ast
import copy
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
    assert "nox -s parity -- --require-gpu --strict-time" in runs["gpu"]  # the gate's own time budget fails the job
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


# The slowest cold gate run measured on an H100 (docs/history/gpu-gate-time.md): killed at 585 s, its perf
# layer unfinished.
SLOWEST_COLD_RUN_S = 585


def cache_problems(workflow: dict) -> list[str]:
    """Why the GPU job's compile cache would not survive a failed, cancelled or timed-out gate, or the gate
    could not finish one cold run ([] when neither)."""
    gpu = workflow["jobs"]["gpu"]
    steps = gpu["steps"]
    uses = [str(s.get("uses", "")) for s in steps]
    (gate,) = [i for i, s in enumerate(steps) if "nox -s parity" in s.get("run", "")]
    restores = [i for i, u in enumerate(uses) if u.startswith("actions/cache/restore")]
    saves = [i for i, u in enumerate(uses) if u.startswith("actions/cache/save")]
    problems = [f"step {i}: actions/cache saves only when the job succeeds" for i, u in enumerate(uses)
                if u.startswith("actions/cache@")]
    if len(restores) != 1 or len(saves) != 1 or not restores[0] < gate < saves[0]:
        return [*problems, "want one actions/cache/restore before the gate and one actions/cache/save after it"]
    restore, save = steps[restores[0]], steps[saves[0]]
    if "always()" not in str(save.get("if", "")):
        problems.append("the save does not run when the gate fails, is cancelled or times out (if: always())")
    if not gpu["env"]["SAMFAST_CACHE_DIR"].endswith("/" + restore["with"]["path"]) or save["with"]["path"] != restore["with"]["path"]:
        problems.append("restore and save must both hold $SAMFAST_CACHE_DIR")
    key = save["with"]["key"]
    if key != restore["with"]["key"] or "steps.cachekey.outputs.key" not in key or "github.run_id" not in key:
        problems.append(f"the key must name the cache folder and change with every run: {key}")
    prefix = str(restore["with"].get("restore-keys", "")).strip()
    if not prefix or not key.startswith(prefix):
        problems.append("restore-keys must be a prefix of the key, so a run restores the newest save")
    gate_minutes = steps[gate].get("timeout-minutes", gpu["timeout-minutes"])
    if gate_minutes * 60 < 2 * SLOWEST_COLD_RUN_S:
        problems.append(f"the gate's {gate_minutes} min leave no margin over one cold run (> {SLOWEST_COLD_RUN_S} s)")
    if gpu["timeout-minutes"] <= sum(s.get("timeout-minutes", 0) for s in steps):
        problems.append("the job's limit could stop the gate before its own does, and the save with it")
    return problems


def test_the_compile_cache_is_saved_whatever_the_gate_did_and_the_gate_has_room_for_a_cold_run(workflow):
    assert cache_problems(workflow) == []


@pytest.mark.parametrize("defect", ["save only on success", "no save after the gate", "one key for every run",
                                    "a gate limit of 10 min", "a job limit below its steps'"])
def test_the_cache_check_fails_on_a_planted_defect(workflow, defect):
    planted = copy.deepcopy(workflow)
    gpu = planted["jobs"]["gpu"]
    save = next(s for s in gpu["steps"] if str(s.get("uses", "")).startswith("actions/cache/save"))
    gate = next(s for s in gpu["steps"] if "nox -s parity" in s.get("run", ""))
    if defect == "save only on success":
        del save["if"]
    elif defect == "no save after the gate":
        gpu["steps"].remove(save)
    elif defect == "one key for every run":
        save["with"]["key"] = "samfast-compile-${{ steps.cachekey.outputs.key }}"
    elif defect == "a gate limit of 10 min":
        gate["timeout-minutes"] = 10
    else:
        gpu["timeout-minutes"] = gate["timeout-minutes"]
    assert cache_problems(planted), f"{defect}: not caught"
