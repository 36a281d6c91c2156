"""bench.train_step_profile runs a real training step of tinysam.train and reports each phase."""

from __future__ import annotations

from bench import train_step_profile


def test_profiles_every_phase_on_the_cpu(capsys):
    train_step_profile.main(["--batch", "1", "--prompts", "2", "--steps", "1", "--pool", "4", "--workers", "1"])
    out = capsys.readouterr().out
    for phase in train_step_profile.PHASES:
        assert f"{phase:10s} cpu" in out
