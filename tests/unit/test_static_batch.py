"""in_static_batches: the encoder always sees its one batch size, and its outputs leave its buffers."""

import torch

from samfast.modeling.static_batch import in_static_batches


def sam2_like_encoder(seen: list):
    """Returns what SAM 2's image encoder returns: dense features, the last level twice, and positional
    encodings expanded over the batch from one cached tensor."""
    cached_pos = torch.randn(4, 3, 3)

    def encoder(images: torch.Tensor) -> dict:
        seen.append(images.shape[0])
        features = [images.sum(1, keepdim=True).expand(-1, 4, -1, -1) * (i + 1) for i in range(2)]
        features = [f.contiguous() for f in features]
        pos = [cached_pos[None].expand(images.shape[0], -1, -1, -1) for _ in features]
        return {"vision_features": features[-1], "backbone_fpn": features, "vision_pos_enc": pos}

    return encoder, cached_pos


def test_outputs_are_the_encoders_on_the_real_images_only():
    seen = []
    encoder, _ = sam2_like_encoder(seen)
    images = torch.randn(3, 2, 3, 3)
    out = in_static_batches(encoder, images, 2)
    assert seen == [2, 2]  # 3 images: one full batch, one padded
    expected = encoder(images)
    for got, want in zip(out["backbone_fpn"], expected["backbone_fpn"]):
        assert torch.equal(got, want)
    assert out["vision_pos_enc"][0].shape == (3, 4, 3, 3)


def test_dense_outputs_are_copied_once_and_expanded_ones_stay_views():
    encoder, cached_pos = sam2_like_encoder([])
    raw = encoder(torch.randn(2, 2, 3, 3))
    out = in_static_batches(lambda images: raw, torch.randn(2, 2, 3, 3), 2)
    # features: copies (a CUDA graph's next call overwrites its buffers), the last level one tensor
    assert all(got.data_ptr() != buf.data_ptr() for got, buf in zip(out["backbone_fpn"], raw["backbone_fpn"]))
    assert out["vision_features"] is out["backbone_fpn"][-1]
    # positional encodings: still views of the one cached tensor, no dense copy per image
    for pos in out["vision_pos_enc"]:
        assert pos.stride(0) == 0 and pos.data_ptr() == cached_pos.data_ptr()


def test_no_static_size_calls_the_encoder_as_it_comes():
    seen = []
    encoder, _ = sam2_like_encoder(seen)
    in_static_batches(encoder, torch.randn(5, 2, 3, 3), None)
    assert seen == [5]
