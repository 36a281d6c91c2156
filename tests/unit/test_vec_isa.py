"""The CPU vector-ISA probe runs once per cache folder and machine, and is trusted only when it agrees with the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from parity.gate import vec_isa
from tests.child_env import child_env

AGREE = {"probed": ["avx512", "avx2"], "claimed": ["avx512", "avx2"]}


class Probe:
    def __init__(self, result):
        self.result, self.calls = result, 0

    def __call__(self):
        self.calls += 1
        return dict(self.result)


def test_agreeing_probe_runs_once_and_every_later_process_trusts_the_cpu(tmp_path):
    probe = Probe(AGREE)
    env = {}
    note = vec_isa.settle(tmp_path, may_write=True, env=env, run_probe=probe, fingerprint=lambda: "this machine")
    assert env == {vec_isa.ENV: "1"} and "avx512" in note and probe.calls == 1
    later = {}
    vec_isa.settle(tmp_path, may_write=True, env=later, run_probe=probe, fingerprint=lambda: "this machine")
    assert later == {vec_isa.ENV: "1"} and probe.calls == 1  # the recorded verdict, no second probe


def test_an_isa_that_fails_the_probe_leaves_every_process_probing(tmp_path):
    """The planted defect: the CPU reports AVX-512 but the compiler cannot build it. Trusting the CPU's
    flags would pick a kernel ISA that does not build, so nothing is set."""
    probe = Probe({"probed": ["avx2"], "claimed": ["avx512", "avx2"]})
    env = {}
    note = vec_isa.settle(tmp_path, may_write=True, env=env, run_probe=probe, fingerprint=lambda: "m")
    assert env == {} and "avx512" in note and "failed the probe" in note
    vec_isa.settle(tmp_path, may_write=True, env=env, run_probe=probe, fingerprint=lambda: "m")
    assert env == {} and probe.calls == 1


def test_when_no_isa_passes_the_probe_every_process_is_told_so(tmp_path):
    """The H100 runner's case: AVX2 claimed, its probe failed. 0 gives inductor the probe's answer
    (no vector ISA) without probing again; the claimed ISA is never trusted."""
    probe = Probe({"probed": [], "claimed": ["avx2"]})
    env = {}
    note = vec_isa.settle(tmp_path, may_write=True, env=env, run_probe=probe, fingerprint=lambda: "m")
    assert env == {vec_isa.ENV: "0"} and "none usable" in note and "avx2" in note
    later = {}
    vec_isa.settle(tmp_path, may_write=True, env=later, run_probe=probe, fingerprint=lambda: "m")
    assert later == {vec_isa.ENV: "0"} and probe.calls == 1


def test_told_none_is_usable_inductor_picks_no_isa():
    """What ENV=0 does in a fresh process with the installed inductor: no ISA valid, the invalid one picked."""
    pytest.importorskip("torch")
    code = ("from torch._inductor.cpu_vec_isa import valid_vec_isa_list, pick_vec_isa, invalid_vec_isa; "
            "print(valid_vec_isa_list() == [] and pick_vec_isa() is invalid_vec_isa)")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(**{vec_isa.ENV: "0"}), capture_output=True,
                         text=True, timeout=600, check=True).stdout
    assert out.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("record", ["another machine", "garbage", "missing keys"])
def test_a_verdict_from_another_machine_or_unreadable_is_probed_again(tmp_path, record):
    text = {"another machine": json.dumps({"fingerprint": "other", **AGREE}),
            "garbage": "{not json", "missing keys": json.dumps({"fingerprint": "m"})}[record]
    (tmp_path / vec_isa.RECORD).write_text(text)
    probe = Probe(AGREE)
    env = {}
    vec_isa.settle(tmp_path, may_write=True, env=env, run_probe=probe, fingerprint=lambda: "m")
    assert probe.calls == 1 and env == {vec_isa.ENV: "1"}
    assert json.loads((tmp_path / vec_isa.RECORD).read_text())["fingerprint"] == "m"


def test_a_run_sharing_the_folder_never_writes_and_the_callers_setting_wins(tmp_path):
    probe = Probe(AGREE)
    env = {}
    assert "each process probes" in vec_isa.settle(tmp_path, may_write=False, env=env, run_probe=probe,
                                                   fingerprint=lambda: "m")
    assert env == {} and probe.calls == 0 and not (tmp_path / vec_isa.RECORD).exists()
    env = {vec_isa.ENV: "0"}
    assert "as set by the caller" in vec_isa.settle(tmp_path, may_write=True, env=env, run_probe=probe,
                                                    fingerprint=lambda: "m")
    assert env == {vec_isa.ENV: "0"} and probe.calls == 0


@pytest.mark.slow(reason="the real probe compiles a C++ kernel per vector ISA, then a fresh process imports torch: "
                         "72 s on a busy H200 host's CPU layer")
def test_on_this_machine_trusting_the_cpu_picks_what_the_probe_picks(tmp_path):
    """The real probe, then a fresh process with the setting: inductor's ISA list and choice are the same."""
    pytest.importorskip("torch")
    env = {}
    vec_isa.settle(tmp_path, may_write=True, env=env)
    record = json.loads((tmp_path / vec_isa.RECORD).read_text())
    if env != {vec_isa.ENV: "1"} or not record["probed"]:
        pytest.skip(f"no vector ISA, or the CPU reports ISAs its compiler cannot build: {record}")
    code = ("from torch._inductor.cpu_vec_isa import valid_vec_isa_list, pick_vec_isa; import json; "
            "print(json.dumps([[str(i) for i in valid_vec_isa_list()], str(pick_vec_isa())]))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(**env), capture_output=True, text=True,
                         timeout=600, check=True).stdout
    trusted, picked = json.loads(out.strip().splitlines()[-1])
    assert trusted == record["probed"]
    assert picked == record["probed"][0]


def test_an_inductor_without_the_probe_leaves_each_process_probing(tmp_path):
    def moved():
        raise AttributeError("valid_vec_isa_list has no __wrapped__")

    env = {}
    note = vec_isa.settle(tmp_path, may_write=True, env=env, run_probe=moved, fingerprint=lambda: "m")
    assert env == {} and "not settled (AttributeError" in note and not (tmp_path / vec_isa.RECORD).exists()
