"""The int8 and 2:4 sparse switches: what they do to the image encoder's linear layers.

    quantize_linears(sam.image_encoder, sam.encoder_linears(), int8=True, sparse=False)

Only the linears the model names change (Sam.encoder_linears: the nn.Linear layers inside the
encoder's transformer blocks, attn.qkv, attn.proj, mlp.lin1, mlp.lin2: nearly all of the encoder's
FLOPs); patch embedding, neck, prompt encoder and mask decoder stay as they are.

* int8: torchao's Int8DynamicActivationInt8WeightConfig: int8 weights with per-output-channel
  scales, activations quantized per token at run time, an int8 x int8 -> int32 matmul, then the
  rescale. Runs on the CPU too (torchao falls back to an int32 matmul there: slow, but exact).
* sparse: 2:4 magnitude pruning (`prune_2_4`) and semi-structured storage
  (`torch.sparse.to_sparse_semi_structured`): a CUDA GPU of compute capability >= 8.0 and bf16 or
  fp16 weights. The backend (cuSPARSELt or CUTLASS) comes from env SPARSE_BACKEND, or, by default
  ("auto"), from timing both on the encoder's own linear shapes (`measure_sparse_backends`).
* fp8: torchao's Float8DynamicActivationFloat8WeightConfig with rowwise scales (PerRow): e4m3
  weights with a scale per output channel, activations cast to e4m3 per token at run time, one
  scaled fp8 GEMM (Hopper's native low-precision path, 2x the bf16 tensor-core rate). Needs a CUDA
  GPU of compute capability >= 8.9 (Ada, Hopper or newer) and K, N multiples of 16.
* int8 + sparse (the cumulative ladder's `sparse`): needs torchao's int8 2:4 layout
  (SemiSparseLayout), which torchao 0.18 no longer has; refused with a StageError that says
  which stages to use instead.

Inductor flags for int8. The SAM-fast tutorial sets `force_fuse_int_mm_with_mul` (fuse the int32
matmul with its rescale so the int32 product is never written out) and `use_mixed_mm`. Both are
*global* `torch._inductor.config` flags. We do not set them globally: the encoder's `compile()` is
wrapped so that exactly this encoder's torch.compile gets them as per-compile `options` (the
mode's own options are folded in, which is what `mode=` does inside torch.compile). A caller who
compiles the encoder some other way can pass `INT8_INDUCTOR_FLAGS` as options themselves. Flags
that this torch does not have are skipped (use_mixed_mm is ignored, deprecated, in torch >= 2.6).
We also turn off torchao's own `set_inductor_config`, which would set coordinate-descent tuning and
others globally for every later compile in the process.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from samfast.errors import StageError

INT8_INDUCTOR_FLAGS = {"force_fuse_int_mm_with_mul": True, "use_mixed_mm": True}
SPARSE_BACKENDS = ("cusparselt", "cutlass")
# Rows of the activation used to choose a sparse backend by timing: two images' 64x64 tokens.
AUTO_BACKEND_M = 2 * 64 * 64
# A sparse product of the same pruned weight differs from the dense one by accumulation order only.
MAX_SPARSE_REL_ERR = 1e-2


def quantize_linears(image_encoder: nn.Module, linears: dict[str, nn.Linear], *, int8: bool, sparse: bool,
                     fp8: bool = False) -> None:
    """Apply the int8, fp8 and/or 2:4 sparse switch to `linears` (modules inside `image_encoder`), in place.

    The model names the linears (Sam.encoder_linears), so a family whose encoder is laid out
    otherwise plugs in unchanged; `image_encoder` is the module the compile switch compiles (int8
    hands its compile inductor flags). Call before compiling the encoder (samfast.stages.apply_stages
    does). Raises StageError (a ValueError) when the combination or the machine cannot run it, saying
    what to use.
    """
    if not linears:
        raise StageError("the image encoder has no nn.Linear layers in its blocks to quantize or sparsify")
    chosen = _is_one_of(linears)
    if fp8:
        _fp8(image_encoder, linears, chosen)
    elif int8 and sparse:
        _int8_sparse(image_encoder, linears, chosen)
    elif int8:
        _int8(image_encoder, chosen)
    elif sparse:
        _sparse(image_encoder, linears)


def encoder_linears(image_encoder: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear inside a ViT encoder's `blocks`, by name within the encoder (what Sam.encoder_linears offers)."""
    return {name: m for name, m in image_encoder.named_modules() if isinstance(m, nn.Linear) and name.startswith("blocks.")}


def _is_one_of(linears: dict[str, nn.Linear]):
    """torchao's filter_fn for exactly these modules: by identity, since their names are the model's, not the encoder's."""
    ids = {id(m) for m in linears.values()}
    return lambda module, _name: id(module) in ids


# --- int8 ---------------------------------------------------------------------------------------
def _int8(image_encoder: nn.Module, chosen) -> None:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(image_encoder, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False), filter_fn=chosen)
    _compile_with_inductor_flags(image_encoder, INT8_INDUCTOR_FLAGS)


def supported_inductor_flags(flags: dict) -> dict:
    """The subset of `flags` that this torch's inductor config has."""
    import torch._inductor.config as inductor_config

    return {k: v for k, v in flags.items() if hasattr(inductor_config, k)}


def _compile_with_inductor_flags(module: nn.Module, flags: dict) -> None:
    """Make `module.compile(...)` pass `flags` to inductor for this module's compile only."""
    flags = supported_inductor_flags(flags)
    if not flags:
        return

    def compile(self, *args, mode: str | None = None, options: dict | None = None, dynamic=None, **kwargs):
        from torch._inductor import list_mode_options

        merged = {**(list_mode_options(mode, dynamic) if mode and mode != "default" else {}), **(options or {}), **flags}
        type(self).compile(self, *args, options=merged, dynamic=dynamic, **kwargs)

    module.compile = types.MethodType(compile, module)
    module.inductor_flags = flags  # for reports: what this module's compile adds


# --- fp8 -----------------------------------------------------------------------------------------
FP8_MIN_CAPABILITY = (8, 9)
# Per-token amax floor of activation quantization (fp8 here, fp8 and int8 in kernels.gelu_quantize):
# far below any real activation (O(1)), far above fp32's smallest normal.
ACTIVATION_AMAX_FLOOR = 1e-12


def check_fp8_supported(weight: torch.Tensor) -> None:
    """Raise StageError naming the problem and the fix when `weight` cannot take the fp8 switch here."""
    fix = ("run the fp8 stage on a CUDA GPU of compute capability >= 8.9 (L4, L40, H100, H200), or swap fp8 for "
           "int8 in the stage (e.g. 'bf16+sdpa+int8')")
    if weight.device.type != "cuda":
        raise StageError(f"fp8 needs a CUDA GPU with fp8 tensor cores; the model is on {weight.device.type}: {fix}")
    capability = torch.cuda.get_device_capability(weight.device)
    if capability < FP8_MIN_CAPABILITY:
        raise StageError(
            f"fp8 needs compute capability >= 8.9; {torch.cuda.get_device_name(weight.device)} has "
            f"{capability[0]}.{capability[1]}: {fix}"
        )
    n, k = weight.shape
    if n % 16 or k % 16:
        raise StageError(f"fp8 GEMMs need in and out features that are multiples of 16, got {n}x{k}")


def _fp8(image_encoder: nn.Module, linears: dict[str, nn.Linear], chosen) -> None:
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    for linear in linears.values():
        check_fp8_supported(linear.weight)
    # activation_value_lb: an all-zero token row (the zero padding of 14x14 windows, padded batch
    # slots) has amax 0, and torchao's scale amax / 448 would then be 0 and the cast 0 / 0 = NaN.
    config = Float8DynamicActivationFloat8WeightConfig(
        granularity=PerRow(), activation_value_lb=ACTIVATION_AMAX_FLOOR, set_inductor_config=False)
    quantize_(image_encoder, config, filter_fn=chosen)


# --- 2:4 sparsity -------------------------------------------------------------------------------
def prune_2_4(weight: torch.Tensor) -> torch.Tensor:
    """2:4 magnitude pruning along the last (input, K) dimension.

    In every group of 4 consecutive weights the 2 of largest |w| are kept and the other 2 set to
    zero; among equal magnitudes the lower index is kept (deterministic). Any float dtype, any
    device; returns a new tensor of the same shape and dtype. Idempotent.
    """
    if not weight.is_floating_point():
        raise TypeError(f"prune_2_4 needs a floating-point weight, got {weight.dtype}")
    if weight.ndim == 0 or weight.shape[-1] % 4:
        raise ValueError(
            f"2:4 pruning groups the last dimension in fours: weight shape {tuple(weight.shape)} has "
            f"K = {weight.shape[-1] if weight.ndim else 'none'}, not a multiple of 4"
        )
    groups = weight.reshape(-1, 4)
    # A stable descending sort keeps the lower index first among ties.
    order = torch.sort(groups.abs().float(), dim=-1, descending=True, stable=True).indices
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order[:, :2], True)
    return torch.where(keep, groups, torch.zeros((), dtype=weight.dtype, device=weight.device)).reshape(weight.shape)


def check_sparse_supported(weight: torch.Tensor) -> None:
    """Raise StageError naming the problem and the fix when `weight` cannot be stored 2:4 here."""
    fix = "use stages 'bf16+sparse' (or the ladder) on a CUDA GPU of compute capability >= 8.0"
    if weight.device.type != "cuda":
        raise StageError(
            f"2:4 sparsity needs a CUDA GPU with compute capability >= 8.0 and bf16/fp16 weights; the "
            f"model is on {weight.device.type}: {fix}"
        )
    capability = torch.cuda.get_device_capability(weight.device)
    if capability < (8, 0):
        raise StageError(
            f"2:4 sparsity needs compute capability >= 8.0 (Ampere or newer); "
            f"{torch.cuda.get_device_name(weight.device)} has {capability[0]}.{capability[1]}"
        )
    if weight.dtype not in (torch.bfloat16, torch.float16):
        raise StageError(
            f"2:4 sparsity needs bf16/fp16 weights (cuSPARSELt has no fp32), got {weight.dtype}: {fix}"
        )
    n, k = weight.shape
    if n % 32 or k % 64:
        raise StageError(
            f"2:4 semi-structured weights need out_features a multiple of 32 and in_features a multiple "
            f"of 64 (cuSPARSELt and CUTLASS both), got {n}x{k}: this model's linears cannot be sparsified"
        )


@contextlib.contextmanager
def _backend(name: str) -> Iterator[None]:
    """to_sparse_semi_structured picks its subclass from SparseSemiStructuredTensor._FORCE_CUTLASS."""
    from torch.sparse import SparseSemiStructuredTensor

    if name not in SPARSE_BACKENDS:
        raise StageError(f"unknown sparse backend {name!r}; choose one of {', '.join(SPARSE_BACKENDS)}")
    saved = SparseSemiStructuredTensor._FORCE_CUTLASS
    SparseSemiStructuredTensor._FORCE_CUTLASS = name == "cutlass"
    try:
        yield
    finally:
        SparseSemiStructuredTensor._FORCE_CUTLASS = saved


def to_semi_structured(weight: torch.Tensor, backend: str) -> torch.Tensor:
    """A 2:4-pruned copy of `weight` in the semi-structured layout of `backend`."""
    with _backend(backend):
        return torch.sparse.to_sparse_semi_structured(prune_2_4(weight.detach()).contiguous())


def measure_sparse_backends(M: int, K: int, N: int, dtype: torch.dtype = torch.bfloat16, device="cuda") -> dict[str, dict]:
    """Time one linear (M x K activations, N x K weight, 2:4-pruned) dense and with each 2:4 backend.

    Returns {"dense" | "cusparselt" | "cutlass": {"us": median microseconds or None, "rel_err":
    relative L2 error vs the dense product of the same pruned weight, "error": None or why it
    failed}}. Errors are caught per backend (CUTLASS 2:4 kernels are not built for sm90, for one).
    Timed with triton.testing.do_bench (median).
    """
    from triton.testing import do_bench

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(M, K, generator=g, device=device).to(dtype)
    w = prune_2_4(torch.randn(N, K, generator=g, device=device).to(dtype))
    bias = torch.randn(N, generator=g, device=device).to(dtype)
    ref = F.linear(x, w, bias)
    ways = {"dense": lambda: w, **{name: (lambda name=name: to_semi_structured(w, name)) for name in SPARSE_BACKENDS}}
    results = {}
    for name, make_weight in ways.items():
        try:
            weight = make_weight()
            out = F.linear(x, weight, bias)
            rel_err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            us = 1e3 * do_bench(lambda: F.linear(x, weight, bias), return_mode="median")
            results[name] = {"us": us, "rel_err": rel_err, "error": None}
        except Exception as err:  # noqa: BLE001 - report any backend failure, never crash the caller
            results[name] = {"us": None, "rel_err": None, "error": _one_line(err)}
    return results


def _one_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def choose_sparse_backend(shapes: list[tuple[int, int]], dtype: torch.dtype, device) -> tuple[str, dict]:
    """The backend named by env SPARSE_BACKEND, or ("auto") the fastest correct one over `shapes` (N, K).

    Returns (backend, timings by "NxK" shape) — timings empty when the env var chose.
    """
    wanted = os.environ.get("SPARSE_BACKEND", "auto").strip().lower()
    if wanted in SPARSE_BACKENDS:
        return wanted, {}
    if wanted != "auto":
        raise StageError(f"SPARSE_BACKEND={wanted!r}: choose one of {', '.join(SPARSE_BACKENDS)} or 'auto'")
    timings = {f"{n}x{k}": measure_sparse_backends(AUTO_BACKEND_M, k, n, dtype, device) for n, k in sorted(set(shapes))}
    totals, problems = {}, {}
    for name in SPARSE_BACKENDS:
        bad = [f"{shape}: {_problem(t[name])}" for shape, t in timings.items() if _problem(t[name])]
        if bad:
            problems[name] = bad[0]
        else:
            totals[name] = sum(t[name]["us"] for t in timings.values())
    if not totals:
        raise StageError(f"no 2:4 backend works on this GPU ({problems}); run without the sparse switch")
    return min(totals, key=totals.get), timings


def _problem(run: dict) -> str | None:
    """Why a measured backend run cannot be used (it failed, or its answer is wrong), or None."""
    if run["error"]:
        return run["error"]
    if run["rel_err"] > MAX_SPARSE_REL_ERR:
        return f"wrong answer: rel L2 error {run['rel_err']:.3g} vs dense"
    return None


class SemiStructuredLinear(nn.Linear):
    """An nn.Linear whose weight is 2:4 semi-structured and whose input is flattened to 2-D.

    The semi-structured tensor subclasses implement only 2-D products; under torch.compile a 4-D
    input (the encoder's (B, H, W, C) tokens) reaches them as `expand`, which they refuse. Same
    state-dict keys and parameters as the nn.Linear it replaces.
    """

    @classmethod
    def from_linear(cls, linear: nn.Linear, backend: str) -> SemiStructuredLinear:
        sparse = cls.__new__(cls)
        nn.Module.__init__(sparse)
        sparse.in_features, sparse.out_features = linear.in_features, linear.out_features
        sparse.weight = nn.Parameter(to_semi_structured(linear.weight, backend), requires_grad=False)
        sparse.bias = linear.bias
        return sparse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = F.linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return flat.reshape(*x.shape[:-1], self.out_features)


def _sparse(image_encoder: nn.Module, linears: dict[str, nn.Linear]) -> None:
    for linear in linears.values():
        check_sparse_supported(linear.weight)
    first = next(iter(linears.values())).weight
    backend, timings = choose_sparse_backend([tuple(m.weight.shape) for m in linears.values()], first.dtype, first.device)
    swapped = {id(m): SemiStructuredLinear.from_linear(m, backend) for m in linears.values()}
    for parent in list(image_encoder.modules()):
        for child, module in parent.named_children():
            if id(module) in swapped:
                setattr(parent, child, swapped[id(module)])
    # for reports: which backend, and the timings that chose it (empty when SPARSE_BACKEND chose)
    image_encoder.sparse_backend = backend
    image_encoder.sparse_timings = timings


# --- int8 + 2:4 ---------------------------------------------------------------------------------
def _int8_sparse(image_encoder: nn.Module, linears: dict[str, nn.Linear], chosen) -> None:
    try:
        from torchao.dtypes import SemiSparseLayout  # older torchao releases had it
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError:
        import torchao

        raise StageError(
            f"int8 + 2:4 sparse together needs torchao's int8 semi-sparse layout (SemiSparseLayout), which "
            f"torchao {torchao.__version__} does not have: use stages 'bf16+compile+sdpa+triton+nt+sparse' "
            "(2:4 sparse in bf16, no int8) or the 'int8' stage (int8, dense)"
        ) from None
    for linear in linears.values():
        check_sparse_supported(linear.weight)
        linear.weight.data = prune_2_4(linear.weight.data)
    quantize_(
        image_encoder,
        Int8DynamicActivationInt8WeightConfig(layout=SemiSparseLayout(), set_inductor_config=False),
        filter_fn=chosen,
    )
    _compile_with_inductor_flags(image_encoder, INT8_INDUCTOR_FLAGS)
