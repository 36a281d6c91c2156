"""Several objects' stored outputs read as one batch (samfast.video.memory_bank.StackedFrameOutput): the
objects of one batched step, split per object, come back as a view of the step's tensors (no copy per
tracked frame); anything else is copied, and either way equals torch.cat of the parts."""

from __future__ import annotations

import torch

from samfast.video.memory_bank import FrameOutput, StackedFrameOutput


def step_output(objects: int, seed: int) -> FrameOutput:
    """A batched step's compact output as the predictor keeps it: channels-last bf16 memory, one
    positional encoding expanded to every object."""
    gen = torch.Generator().manual_seed(seed)
    return FrameOutput(
        pred_masks=torch.randn(objects, 1, 8, 8, generator=gen),
        obj_ptr=torch.randn(objects, 256, generator=gen),
        object_score_logits=torch.randn(objects, 1, generator=gen),
        maskmem_features=torch.randn(objects, 64, 4, 4, generator=gen)
        .to(torch.bfloat16)
        .contiguous(memory_format=torch.channels_last),
        maskmem_pos_enc=[torch.randn(1, 64, 4, 4, generator=gen).expand(objects, -1, -1, -1)],
    )


def stacked_fields(outputs: list[FrameOutput]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{field: (StackedFrameOutput's tensor, torch.cat of the parts)}"""
    stacked = StackedFrameOutput(outputs)
    return {
        "obj_ptr": (stacked.obj_ptr, torch.cat([out.obj_ptr for out in outputs])),
        "maskmem_features": (stacked.maskmem_features, torch.cat([out.maskmem_features for out in outputs])),
        "maskmem_pos_enc": (stacked.maskmem_pos_enc[0], torch.cat([out.maskmem_pos_enc[0] for out in outputs])),
    }


def test_one_steps_objects_come_back_as_views():
    step = step_output(objects=5, seed=0)
    fields = stacked_fields(step.split())
    for name, (stacked, copied) in fields.items():
        assert torch.equal(stacked, copied), name
        whole = getattr(step, name) if name != "maskmem_pos_enc" else step.maskmem_pos_enc[0]
        assert stacked.data_ptr() == whole.data_ptr() and stacked.stride() == whole.stride(), name


def test_a_subset_in_order_is_a_view_of_its_rows():
    parts = step_output(objects=5, seed=1).split()
    stacked, copied = stacked_fields(parts[1:4])["maskmem_features"]
    assert torch.equal(stacked, copied)
    assert stacked.data_ptr() == parts[1].maskmem_features.data_ptr()


def test_objects_out_of_order_or_from_other_steps_are_copied():
    first, second = step_output(objects=3, seed=2).split(), step_output(objects=2, seed=3).split()
    for outputs in ([first[2], first[0], first[1]], [first[0], first[2]], first + second):
        fields = stacked_fields(outputs)
        for name, (stacked, copied) in fields.items():
            assert torch.equal(stacked, copied), name
        for name in ("obj_ptr", "maskmem_features"):
            storages = {getattr(out, name).untyped_storage().data_ptr() for out in outputs}
            assert fields[name][0].untyped_storage().data_ptr() not in storages, name


def test_one_encoding_expanded_to_every_object_stays_one_row():
    """Any objects of one video share its one encoding (stride 0 over the objects): a view, whatever the order."""
    parts = step_output(objects=4, seed=5).split()
    stacked, copied = stacked_fields([parts[3], parts[1]])["maskmem_pos_enc"]
    assert torch.equal(stacked, copied) and stacked.stride(0) == 0


def test_a_single_object_is_read_in_place():
    (only,) = step_output(objects=1, seed=4).split()
    stacked = StackedFrameOutput([only]).maskmem_features
    assert torch.equal(stacked, only.maskmem_features) and stacked.data_ptr() == only.maskmem_features.data_ptr()
