"""bench.encoder_ratio: the pairing that cancels a drifting machine, and a quick CPU run that writes its
table, JSON and chart (SAM 1's vit_tiny beside segment_anything: the same plumbing as SAM 2's rows)."""

from __future__ import annotations

import json

import pytest

from bench import encoder_ratio


def drifting_machine(drift: float):
    """Two timed blocks on one clock: A takes 1 s and B 1.5 s on a machine whose speed changes by `drift`
    of its first speed with each block timed (a GPU warming up or throttling)."""
    position = iter(range(1000))

    def block(seconds):
        return lambda: seconds * (1 + drift * next(position))

    return block(1.0), block(1.5)


@pytest.mark.parametrize("drift", [0.0, 0.02, -0.03])
def test_each_pair_ratio_is_exact_on_a_linearly_drifting_machine(drift):
    a, b = drifting_machine(drift)
    pairs = encoder_ratio.alternating_ratios(a, b, pairs=5)
    assert len(pairs) == 5
    for _, _, ratio in pairs:
        assert ratio == pytest.approx(1.5, rel=1e-12)


def test_the_drift_is_large_enough_to_bias_blocks_timed_one_after_the_other():
    """The case above is not trivially met: timed as A, A, B, B (the ladder's order, one row after the
    other) the same machine gives a ratio off by about 4%."""
    a, b = drifting_machine(0.02)
    a1, a2, b1, b2 = a(), a(), b(), b()
    assert abs((b1 + b2) / (a1 + a2) / 1.5 - 1) > 0.03


def test_quick_cpu_run_writes_table_json_and_chart(tmp_path):
    assert encoder_ratio.main(["--cpu", "--model", "vit_tiny", "--batch", "1", "--stage", "fp32+nt", "--reference", "fp32",
                               "--pairs", "2", "--warmup", "0", "--iters", "1", "--target", "1000",
                               "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "ratio.json").read_text())
    assert len(result["pairs"]) == 2
    for pair in result["pairs"]:
        assert pair["samfast_s"] > 0 and pair["reference_s"] > 0
        assert pair["ratio"] == pytest.approx(pair["reference_s"] / pair["samfast_s"])
    table = (tmp_path / "ratio.md").read_text()
    assert "vit_tiny, batch 1: fp32+nt is" in table and "target 1000x: NOT met" in table
    assert "seeded synthetic" in table and table.count("\n| ") == 3  # the header and one row a pair
    assert "- command: `python -m bench.encoder_ratio --cpu --model vit_tiny --batch 1 --stage fp32+nt" in table
    assert "2 pairs of blocks of 1 calls" in result["environment"]["timing"]
    assert (tmp_path / "ratio.png").stat().st_size > 0


def test_a_bad_stage_name_fails_before_anything_is_built():
    with pytest.raises(ValueError):
        encoder_ratio.parse_args(["--stage", "bf16+warp"])


@pytest.mark.parametrize("flag, value", [("--pairs", "0"), ("--iters", "0"), ("--warmup", "-1")])
def test_counts_that_leave_nothing_to_time_are_refused_with_exit_code_2(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        encoder_ratio.parse_args([flag, value])
    assert exit_info.value.code == 2 and "--pairs and --iters need at least 1" in capsys.readouterr().err


def test_a_reference_this_device_cannot_run_is_an_input_error_naming_the_fix(tmp_path, capsys):
    """sam2's compiled bf16 encoder runs under CUDA autocast only: on a CPU the run stops before samfast's
    model is built, with exit code 2 and the flag that works here."""
    pytest.importorskip("sam2", reason="the SAM 2 reference package sam2==1.1.0 is not installed")
    assert encoder_ratio.main(["--cpu", "--model", "sam2.1_hiera_nano", "--batch", "1", "--stage", "fp32",
                               "--reference", "bf16", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "GPU only" in err and "--reference fp32" in err and "built, first call" not in err
    assert not (tmp_path / "ratio.json").exists()


@pytest.mark.parametrize("ratios, said", [([1.52, 1.55, 1.6], "met by every pair"), ([1.48, 1.52, 1.55], "met by the median"),
                                          ([1.46, 1.47, 1.52], "NOT met")])
def test_the_target_is_said_met_by_every_pair_by_the_median_or_not(ratios, said):
    assert encoder_ratio.verdict(ratios, 1.5) == said
