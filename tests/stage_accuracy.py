"""The stage layer's accuracy rule, one copy for tests/gpu/test_stages_gpu.py and its CPU twins.

A stage's image embeddings and low-res logits must be within its max_logits_rel_l2 of fp32's, and
its predicted IoUs within max_score_abs_err (parity/budgets.toml, [accuracy.<precision>]).
"""

from __future__ import annotations

import contextlib

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


def random_scene(sizes: list[tuple[int, int]], prompts_per_image: list[int], seed: int = 0):
    """(images, Prompts per image): random uint8 images of the given sizes, one-point prompts inside them."""
    from samfast import Prompts

    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    prompts = [
        Prompts(point_coords=rng.uniform(0, 1, (n, 1, 2)) * np.array([w - 1, h - 1]), point_labels=np.ones((n, 1)))
        for (h, w), n in zip(sizes, prompts_per_image)
    ]
    return images, prompts


def stage_outputs(model, scene) -> dict[str, torch.Tensor]:
    """What assert_close_to_fp32 compares, for either family: embeddings one image at a time
    (set_image), then predict_batch over all images (the encoder's batches, padded where compiled)."""
    from samfast import SamPredictor

    images, prompts = scene
    predictor = SamPredictor(model)
    embeddings = []
    for image in images:
        predictor.set_image(image)
        embeddings.append(predictor.get_image_embedding().float())
    predictions = predictor.predict_batch(images, prompts)
    return {
        "embeddings": torch.cat(embeddings),
        "low_res_logits": torch.cat([p.low_res_logits.float() for p in predictions]),
        "iou": torch.cat([p.iou_predictions.float() for p in predictions]),
    }


@contextlib.contextmanager
def tf32_off():
    """TF32 off for matmul and cuDNN inside the block, as goldens are made; the settings restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def true_fp32_outputs(model, scene) -> dict[str, torch.Tensor]:
    """stage_outputs with TF32 off (tf32_off)."""
    with tf32_off():
        return stage_outputs(model, scene)
