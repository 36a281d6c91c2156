"""The stage layer's accuracy rule, one copy for tests/gpu/test_stages_gpu.py and its CPU twins.

A stage's image embeddings and low-res logits must be within its max_logits_rel_l2 of fp32's, and
its predicted IoUs within max_score_abs_err (parity/budgets.toml, [accuracy.<precision>]).
"""

from __future__ import annotations

import numpy as np
import torch

from parity.compare.gates import load_thresholds, thresholds_for


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def assert_close_to_fp32(stages: str, outputs: dict[str, torch.Tensor], fp32_outputs: dict[str, torch.Tensor]) -> None:
    """outputs / fp32_outputs: "embeddings", "low_res_logits" and "iou" of the same inputs."""
    limits = thresholds_for(stages, load_thresholds())
    errors = {k: rel_l2(outputs[k], fp32_outputs[k]) for k in ("embeddings", "low_res_logits")}
    score_err = (outputs["iou"].double() - fp32_outputs["iou"].double()).abs().max().item()
    assert all(np.isfinite(list(errors.values())))
    assert max(errors.values()) <= limits["max_logits_rel_l2"], (
        f"{stages}: relative L2 error vs fp32 {errors} exceeds max_logits_rel_l2 {limits['max_logits_rel_l2']}"
    )
    assert score_err <= limits["max_score_abs_err"], (
        f"{stages}: predicted IoU off by {score_err:.4g} > max_score_abs_err {limits['max_score_abs_err']}"
    )
