"""The int8 and 2:4 sparse switches on the CPU: pruning rule, int8 accuracy, clear refusals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

import samfast
from samfast import quantize
from samfast.quantize import INT8_INDUCTOR_FLAGS, encoder_linears, prune_2_4, quantize_linears
from samfast.stages import StageError


# --- prune_2_4 -----------------------------------------------------------------------------------
def _brute_force_2_4(w: np.ndarray) -> np.ndarray:
    """Keep the two largest |w| of each group of 4 (lower index first among ties), the slow way."""
    out = np.zeros_like(w)
    flat, pruned = w.reshape(-1, 4), out.reshape(-1, 4)
    for row, (group, target) in enumerate(zip(flat, pruned)):
        ranked = sorted(range(4), key=lambda i: (-abs(group[i]), i))
        for i in ranked[:2]:
            target[i] = group[i]
    return out


def test_prune_keeps_the_two_largest_of_each_group_of_four():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    pruned = prune_2_4(w)
    np.testing.assert_array_equal(pruned.numpy(), _brute_force_2_4(w.numpy()))
    groups, kept = w.reshape(-1, 4).abs(), pruned.reshape(-1, 4) != 0
    assert (kept.sum(-1) == 2).all()
    # every kept magnitude is >= every dropped one in its group
    assert (groups.masked_fill(~kept, float("inf")).amin(-1) >= groups.masked_fill(kept, -1).amax(-1)).all()


def test_prune_zeroes_exactly_half_and_is_idempotent():
    w = torch.randn(3, 32, 256, generator=torch.Generator().manual_seed(1))
    pruned = prune_2_4(w)
    assert pruned.shape == w.shape
    assert (pruned == 0).sum().item() == w.numel() // 2
    assert torch.equal(prune_2_4(pruned), pruned)
    assert torch.equal(pruned[pruned != 0], w[pruned != 0])  # kept values unchanged, signs included


def test_prune_breaks_ties_by_lower_index():
    w = torch.tensor([[1.0, 1.0, 1.0, 1.0, -2.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 3.0, 5.0, -5.0, 5.0, -5.0]])
    expected = torch.tensor([[1.0, 1.0, 0.0, 0.0, -2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 5.0, -5.0, 0.0, 0.0]])
    assert torch.equal(prune_2_4(w), expected)
    # every one of the 4-choose-2 magnitude orders
    for keep in itertools.combinations(range(4), 2):
        group = torch.tensor([3.0 if i in keep else 1.0 for i in range(4)])
        assert (prune_2_4(group) != 0).nonzero().flatten().tolist() == list(keep)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_prune_any_float_dtype(dtype):
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    pruned = prune_2_4(w)
    assert pruned.dtype == dtype
    np.testing.assert_array_equal(pruned.double().numpy(), _brute_force_2_4(w.double().numpy()))


def test_prune_refuses_k_not_a_multiple_of_four_and_integers():
    with pytest.raises(ValueError, match=r"weight shape \(8, 6\) has K = 6, not a multiple of 4"):
        prune_2_4(torch.randn(8, 6))
    with pytest.raises(TypeError, match="floating-point"):
        prune_2_4(torch.ones(8, 8, dtype=torch.int8))


# --- int8 ----------------------------------------------------------------------------------------
def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _outputs(model):
    predictor = samfast.SamPredictor(model)
    image = np.random.default_rng(0).integers(0, 256, (400, 600, 3), dtype=np.uint8)
    predictor.set_image(image)
    coords = torch.tensor([[[100.0, 120.0]], [[500.0, 300.0]], [[900.0, 600.0]]])
    _, iou, low_res = predictor.predict_torch(coords, torch.ones(3, 1, dtype=torch.int))
    return predictor.features, low_res


def test_int8_on_cpu_quantizes_only_block_linears_and_stays_close_to_fp32():
    from torchao.quantization import Int8Tensor

    fp32 = samfast.build_sam("vit_tiny", device="cpu")
    int8 = samfast.build_sam("vit_tiny", device="cpu", stages="fp32+int8")
    quantized = {n for n, m in int8.named_modules() if isinstance(getattr(m, "weight", None), Int8Tensor)}
    expected = {f"image_encoder.blocks.{i}.{lin}" for i in range(len(int8.image_encoder.blocks))
                for lin in ("attn.qkv", "attn.proj", "mlp.lin1", "mlp.lin2")}
    assert quantized == expected  # patch embed, neck, prompt encoder and decoder untouched
    features, low_res = _outputs(int8)
    ref_features, ref_low_res = _outputs(fp32)
    # measured ~0.015 on the embeddings: per-token / per-channel int8 keeps ~2 decimal digits
    assert _rel_l2(features, ref_features) < 0.1
    assert _rel_l2(low_res, ref_low_res) < 0.1
    assert _rel_l2(features, ref_features) > 0  # it did change something


class _Toy(nn.Module):
    """The smallest module with the encoder's naming: linears inside `blocks`, one outside."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))])
        self.neck = nn.Linear(64, 64)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.neck(x)


def test_int8_inductor_flags_go_to_this_modules_compile_only(monkeypatch):
    import torch._inductor.config as inductor_config

    before = inductor_config.get_config_copy()
    toy = _Toy()
    quantize_linears(toy, encoder_linears(toy), int8=True, sparse=False)
    assert inductor_config.get_config_copy() == before  # nothing global changed
    assert type(toy.neck.weight) is nn.Parameter and type(toy.blocks[0][0].weight) is not nn.Parameter

    seen = {}

    def fake_compile(fn, *args, **kwargs):
        seen.update(kwargs)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    toy.compile(mode="max-autotune", dynamic=False, fullgraph=True)
    assert "mode" not in seen and seen["dynamic"] is False and seen["fullgraph"] is True
    options = seen["options"]
    assert options["max_autotune"] and options["triton.cudagraphs"]  # the mode's own options kept
    assert options["force_fuse_int_mm_with_mul"] is True
    assert set(INT8_INDUCTOR_FLAGS) >= {k for k in options if k in INT8_INDUCTOR_FLAGS}
    seen.clear()
    toy.compile(mode="default")
    assert seen["options"] == quantize.supported_inductor_flags(INT8_INDUCTOR_FLAGS)


@pytest.mark.slow
def test_int8_module_compiles_with_the_flags_on_cpu():
    torch._dynamo.reset()
    toy = _Toy()
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(3))
    ref = toy(x)
    quantize_linears(toy, encoder_linears(toy), int8=True, sparse=False)
    eager = toy(x)
    toy.compile(mode="default", dynamic=False, fullgraph=True)
    try:
        compiled = toy(x)
    finally:
        torch._dynamo.reset()
    assert _rel_l2(eager, ref) < 0.05
    # as a whole, not per element: where eager and compiled code round a value on an int8 step's boundary
    # apart, that element moves by a step's worth (one of 2048 differed by 1.1e-3 in a warm gate run
    # on 2026-11-28, about 1e-4 of the tensor's norm; alone in a process they agree to 1e-7). The bound is 5x
    # below int8's own error (1.0e-2): a compiled path that skipped the quantization fails it.
    assert _rel_l2(compiled, eager) < 2e-3


# --- 2:4 sparse ----------------------------------------------------------------------------------
@pytest.mark.parametrize("stages", ["bf16+sparse", "fp32+sparse"])
def test_sparse_on_cpu_is_refused_clearly(stages):
    with pytest.raises(StageError, match=r"2:4 sparsity needs a CUDA GPU with compute capability >= 8\.0 and bf16/fp16 weights.*on cpu.*'bf16\+sparse'"):
        samfast.build_sam("vit_tiny", device="cpu", stages=stages)


def test_int8_with_sparse_is_refused_or_needs_a_gpu():
    """The ladder's `sparse` includes int8: torchao without the int8 2:4 layout refuses it by name."""
    try:
        from torchao.dtypes import SemiSparseLayout  # noqa: F401

        match = "CUDA GPU"
    except ImportError:
        match = r"int8 \+ 2:4 sparse together needs torchao's int8 semi-sparse layout.*'int8' stage"
    with pytest.raises(StageError, match=match):
        samfast.build_sam("vit_tiny", device="cpu", stages="bf16+int8+sparse")


def test_sparse_backend_setting_is_checked(monkeypatch):
    monkeypatch.setenv("SPARSE_BACKEND", "cutlass")
    assert quantize.choose_sparse_backend([(128, 64)], torch.bfloat16, "cpu") == ("cutlass", {})
    monkeypatch.setenv("SPARSE_BACKEND", "CuSPARSELt")
    assert quantize.choose_sparse_backend([(128, 64)], torch.bfloat16, "cpu") == ("cusparselt", {})
    monkeypatch.setenv("SPARSE_BACKEND", "fastest")
    with pytest.raises(StageError, match="SPARSE_BACKEND='fastest': choose one of cusparselt, cutlass or 'auto'"):
        quantize.choose_sparse_backend([(128, 64)], torch.bfloat16, "cpu")


def test_auto_backend_picks_the_fastest_correct_one(monkeypatch):
    runs = {
        "dense": {"us": 100.0, "rel_err": 0.0, "error": None},
        "cusparselt": {"us": 650.0, "rel_err": 1e-3, "error": None},
        "cutlass": {"us": None, "rel_err": None, "error": "RuntimeError: not supported on sm90"},
    }
    monkeypatch.delenv("SPARSE_BACKEND", raising=False)
    monkeypatch.setattr(quantize, "measure_sparse_backends", lambda *a, **k: runs)
    backend, timings = quantize.choose_sparse_backend([(2304, 768), (768, 768)], torch.bfloat16, "cuda")
    assert backend == "cusparselt" and set(timings) == {"2304x768", "768x768"}
    runs["cusparselt"] = {"us": 50.0, "rel_err": 0.5, "error": None}  # fast but wrong: never chosen
    with pytest.raises(StageError, match="no 2:4 backend works.*wrong answer.*not supported on sm90"):
        quantize.choose_sparse_backend([(768, 768)], torch.bfloat16, "cuda")


def test_sparse_shape_and_dtype_checks_name_the_problem(monkeypatch):
    from types import SimpleNamespace

    def weight(shape=(128, 128), dtype=torch.bfloat16):  # what check_sparse_supported reads of a CUDA weight
        return SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype, shape=shape)

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(StageError, match=r"compute capability >= 8\.0.*Tesla T4 has 7\.5"):
        quantize.check_sparse_supported(weight())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    quantize.check_sparse_supported(weight())  # fine
    with pytest.raises(StageError, match=r"bf16/fp16 weights.*got torch\.float32"):
        quantize.check_sparse_supported(weight(dtype=torch.float32))
    with pytest.raises(StageError, match=r"got 100x128"):
        quantize.check_sparse_supported(weight(shape=(100, 128)))


def test_sparse_switch_swaps_in_flattening_linears(monkeypatch):
    """The sparse switch replaces each block linear by a SemiStructuredLinear that feeds its weight
    2-D inputs only (the semi-structured subclasses refuse `expand` on the encoder's 4-D tokens under
    compile), with unchanged state-dict keys. Semi-structured storage needs a GPU: here a dense
    2:4-pruned weight stands in for it, which is what the layout stores."""
    monkeypatch.setattr(quantize, "check_sparse_supported", lambda weight: None)
    monkeypatch.setattr(quantize, "choose_sparse_backend", lambda shapes, dtype, device: ("cutlass", {}))
    monkeypatch.setattr(quantize, "to_semi_structured", lambda weight, backend: quantize.prune_2_4(weight.detach()))
    encoder = samfast.build_sam("vit_tiny", device="cpu").image_encoder
    keys = list(encoder.state_dict())
    pruned = {name: quantize.prune_2_4(m.weight.detach()) for name, m in quantize.encoder_linears(encoder).items()}
    tokens = torch.randn(2, 8, 8, encoder.blocks[0].mlp.lin1.in_features)
    expected = torch.nn.functional.linear(tokens, pruned["blocks.0.mlp.lin1"], encoder.blocks[0].mlp.lin1.bias)

    quantize_linears(encoder, encoder_linears(encoder), int8=False, sparse=True)

    assert list(encoder.state_dict()) == keys
    swapped = quantize.encoder_linears(encoder)
    assert set(swapped) == set(pruned) and all(isinstance(m, quantize.SemiStructuredLinear) for m in swapped.values())
    lin1 = encoder.blocks[0].mlp.lin1
    seen, linear = [], torch.nn.functional.linear
    monkeypatch.setattr(quantize.F, "linear", lambda x, w, b: seen.append(x.ndim) or linear(x, w, b))
    torch.testing.assert_close(lin1(tokens), expected)
    assert seen == [2]
