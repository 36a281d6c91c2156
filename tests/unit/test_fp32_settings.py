"""The goldens' true-fp32 settings (parity.golden.manifest.fp32_settings) hold inside their block only."""

from __future__ import annotations

import os

import pytest
import torch

from parity.golden.manifest import CUBLAS_WORKSPACE, fp32_settings


def _state() -> tuple:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), os.environ.get(CUBLAS_WORKSPACE))


@pytest.fixture
def loose_settings(monkeypatch):
    """TF32 on and cuDNN benchmarking, as a user's process may have them; put back after the test."""
    before = _state()
    monkeypatch.delenv(CUBLAS_WORKSPACE, raising=False)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    yield _state()
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
     torch.backends.cudnn.benchmark) = before[:4]
    torch.use_deterministic_algorithms(before[4], warn_only=before[5])


def test_true_fp32_inside_and_the_settings_found_after(loose_settings):
    with fp32_settings() as recorded:
        assert recorded == {"matmul_allow_tf32": False, "cudnn_allow_tf32": False, "deterministic_algorithms": True}
        assert _state()[:6] == (False, False, True, False, True, True)
        assert os.environ[CUBLAS_WORKSPACE] == ":4096:8"
    assert _state() == loose_settings


def test_the_settings_come_back_when_the_golden_fails(loose_settings):
    with pytest.raises(RuntimeError, match="planted"), fp32_settings():
        raise RuntimeError("planted")
    assert _state() == loose_settings


def test_a_workspace_the_caller_chose_is_kept(loose_settings, monkeypatch):
    monkeypatch.setenv(CUBLAS_WORKSPACE, ":16:8")
    with fp32_settings():
        assert os.environ[CUBLAS_WORKSPACE] == ":16:8"
    assert os.environ[CUBLAS_WORKSPACE] == ":16:8"
