"""The small SAM 3's trainer (tinysam.train_concept): its data, its DETR loss and a whole run on a CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torchvision.ops import box_convert, generalized_box_iou

import samfast
from parity.golden import manifest as golden_io
from samfast.sam3.checkpoint import DETECTOR_PREFIX, synthetic_state_dict
from samfast.sam3.image_model import FindInput
from tinysam import train_concept
from tinysam.concept_data import PHRASES, build_concept_pool, scene_arrays
from tinysam.concept_loss import concept_loss, match, pairwise_giou


def test_a_scene_keeps_each_objects_category_box_and_mask_area():
    image = np.zeros((100, 200, 3), dtype=np.uint8)
    mask = np.zeros((100, 200), dtype=np.uint8)
    mask[20:60, 50:150] = 1  # 40 rows, 100 columns
    pixels, labels, boxes, masks = scene_arrays(image, [(3, mask)], size=168, mask_size=48)
    assert pixels.shape == (3, 168, 168) and pixels.dtype == torch.uint8
    assert labels.tolist()[:2] == [2, -1]  # category id 3 is phrase index 2; the other slots are empty
    torch.testing.assert_close(boxes[0], torch.tensor([0.5, 0.4, 0.5, 0.4]))
    assert boxes[1:].abs().sum() == 0
    # area fractions: the cells' mean is the object's share of the image (to 2%: where 48 does not divide a
    # side, adaptive average pooling's windows overlap by a pixel)
    assert masks[0].float().mean().item() == pytest.approx(mask.mean(), rel=0.02)
    assert masks[0, 12, 24] == 1 and masks[0, 40, 24] == 0  # inside and outside the object


def test_the_pool_holds_scenes_with_their_instances():
    pool = build_concept_pool(3, seed=0, size=168, mask_size=48, workers=1)
    assert len(pool) == 3 and pool.images.shape == (3, 3, 168, 168)
    kept = pool.labels >= 0
    assert (kept.sum(dim=1) >= 3).all()  # generate_scenes draws 3..10 objects
    assert pool.labels[kept].max() < len(PHRASES)
    boxes = pool.boxes[kept]
    assert ((boxes > 0) & (boxes <= 1)).all()
    assert (pool.masks[kept].float().flatten(1).amax(1) > 0.5).all()  # every kept object covers a cell


def test_pairwise_giou_is_torchvisions_per_prompt():
    generator = torch.Generator().manual_seed(0)
    a = box_convert(torch.rand(2, 5, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.2, "cxcywh", "xyxy")
    b = box_convert(torch.rand(2, 3, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.2, "cxcywh", "xyxy")
    ours = pairwise_giou(a, b, eps=0.0)
    for p in range(2):
        torch.testing.assert_close(ours[p], generalized_box_iou(a[p], b[p]))


def _outputs(boxes: torch.Tensor, logits: torch.Tensor, masks: torch.Tensor, presence: torch.Tensor) -> dict:
    return {"pred_boxes": boxes, "pred_logits": logits[..., None], "pred_masks": masks, "presence_logit_dec": presence[:, None]}


def test_each_instance_is_matched_to_the_query_that_predicts_it():
    queries = torch.tensor([[[0.2, 0.2, 0.1, 0.1], [0.5, 0.5, 0.2, 0.2], [0.8, 0.8, 0.1, 0.1]]]).repeat(2, 1, 1)
    truth = torch.tensor([[[0.8, 0.8, 0.1, 0.1], [0.21, 0.2, 0.1, 0.1]]]).repeat(2, 1, 1)
    valid = torch.tensor([[True, True], [False, False]])  # the second prompt's phrase is not in its image
    rows = match(torch.zeros(2, 3), queries, truth, valid)
    assert sorted(map(tuple, rows.tolist())) == [(0, 0, 1), (0, 2, 0)]


def test_the_loss_is_least_for_the_true_detection_and_a_right_presence():
    truth = torch.tensor([[[0.3, 0.3, 0.2, 0.2]], [[0.0, 0.0, 0.0, 0.0]]])
    truth_masks = torch.zeros(2, 1, 8, 8)
    truth_masks[0, 0, 2:4, 2:4] = 1.0
    valid = torch.tensor([[True], [False]])
    boxes = torch.tensor([[[0.3, 0.3, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2]]]).repeat(2, 1, 1)
    logits = torch.tensor([[8.0, -8.0], [-8.0, -8.0]])
    masks = (truth_masks[0, 0] * 16 - 8).expand(2, 2, 8, 8).clone()
    presence = torch.tensor([8.0, -8.0])
    best, parts = concept_loss(_outputs(boxes, logits, masks, presence), truth, truth_masks, valid)
    assert parts["box"] == 0 and parts["giou"].abs() < 1e-5 and parts["class"] < 1e-3 and parts["presence"] < 1e-3
    # each planted error raises its own term
    moved = boxes.clone()
    moved[0, 0, :2] += 0.1
    for outputs, term in [(_outputs(moved, logits, masks, presence), "box"),
                          (_outputs(moved, logits, masks, presence), "giou"),
                          (_outputs(boxes, -logits, masks, presence), "class"),
                          (_outputs(boxes, logits, -masks, presence), "mask"),
                          (_outputs(boxes, logits, masks, -presence), "presence")]:
        loss, worse = concept_loss(outputs, truth, truth_masks, valid)
        assert worse[term] > parts[term] + 0.05 and loss > best, term


def test_a_training_step_reaches_the_text_encoder_the_detector_and_the_masks():
    model = samfast.build_sam("sam3_tiny", seed=0, device="cpu").requires_grad_(True)
    pool = build_concept_pool(2, seed=0, size=168, mask_size=48, workers=1)
    loss, _ = train_concept.training_step(model, pool, torch.tensor([0, 1]))
    loss.backward()
    tokens = model.backbone.language_backbone.encoder.token_embedding.weight.grad
    assert tokens.abs().sum(dim=1).count_nonzero() >= len(PHRASES)  # each phrase's tokens
    for module in (model.transformer.decoder, model.segmentation_head, model.dot_prod_scoring,
                   model.backbone.vision_backbone.trunk):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_each_decoder_layers_outputs_are_made_as_forward_grounding_makes_the_last_ones():
    """The auxiliary losses' inputs: built for the last layer, they are forward_grounding's own outputs."""
    model = samfast.build_sam("sam3_tiny", seed=0, device="cpu")
    pool = build_concept_pool(1, seed=0, size=168, mask_size=48, workers=1)
    backbone_out = model.backbone.forward_image(train_concept.normalized(pool.images))
    backbone_out.update(model.backbone.forward_text(list(PHRASES[:2])))
    captured = {}
    hook = model.transformer.decoder.register_forward_hook(lambda m, args, output: captured.update(args=args, output=output))
    out = model.forward_grounding(backbone_out, FindInput(torch.zeros(2, dtype=torch.long), torch.arange(2)),
                                  model.empty_prompt(2))
    hook.remove()
    layers = train_concept.layer_outputs(model, captured["args"], captured["output"])
    assert len(layers) == len(model.transformer.decoder.layers)
    for key in ("pred_logits", "pred_boxes", "presence_logit_dec"):
        torch.testing.assert_close(layers[-1][key], out[key], rtol=0, atol=0)
    assert not torch.equal(layers[0]["pred_boxes"], out["pred_boxes"])  # an earlier layer's own boxes


def test_a_smoke_run_writes_a_checkpoint_that_loads_strictly_in_sam3s_layout(tmp_path):
    """The whole run on a CPU: three steps, then the file, its manifest, log and curve."""
    manifest = train_concept.main(["--smoke", "--out", str(tmp_path)])
    path = tmp_path / train_concept.CHECKPOINT_NAME
    assert golden_io.file_sha256(path) == manifest["sha256"] == json.loads(path.with_suffix(".json").read_text())["sha256"]
    assert manifest["steps"] == 3 and set(manifest["validation"]["cgf1"]) == {"heldout", "scenes"}
    assert (tmp_path / train_concept.LOG_NAME).is_file() and (tmp_path / train_concept.CURVE_NAME).is_file()
    state = torch.load(path, weights_only=True)
    seeded = synthetic_state_dict("sam3_tiny", 0)
    assert set(state) == set(seeded)  # sam3.pt's keys, the tracker's too
    trained = samfast.build_sam("sam3_tiny", checkpoint=path, device="cpu")
    for key, tensor in trained.state_dict().items():  # the file's tensors, as build_sam loads them
        assert torch.equal(tensor, state[DETECTOR_PREFIX + key].to(tensor.dtype)), key
    # the steps moved the detector; predict_inst's heads, which the image model trained has not, kept their seed
    token = DETECTOR_PREFIX + "backbone.language_backbone.encoder.token_embedding.weight"
    assert state[token].dtype == torch.float16 and not torch.equal(state[token], seeded[token].half())
    tracker = [key for key in seeded if not key.startswith(DETECTOR_PREFIX)]
    assert tracker and all(torch.equal(state[key], seeded[key].to(state[key].dtype)) for key in tracker)


def test_a_run_stops_where_its_minutes_end(tmp_path, monkeypatch):
    """Validations can take more than the schedule's margin: past --minutes the run stops, saved as usual."""
    monkeypatch.setitem(train_concept.SMOKE_DEFAULTS, "steps", None)
    manifest = train_concept.main(["--smoke", "--minutes", "0", "--out", str(tmp_path)])
    assert manifest["steps"] == 1 and (tmp_path / train_concept.CHECKPOINT_NAME).is_file()
