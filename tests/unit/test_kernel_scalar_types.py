"""The kernels' float arguments keep their math in fp32 when inductor launches them.

Inside a compiled graph inductor types a Python float argument of a user kernel as fp64
(torch._inductor.codegen.triton_utils.signature_of: "Python floats are natively fp64"), where a direct
launch types it fp32. `variance + eps` then promotes the row's whole normalization to fp64: on an H200
the bias-channel norm took 139 and 69 us a call inside Hiera-L's encoder against 97 and 45 with eps cast
to fp32 (docs/measurements/sam2-encoder/eps-fp64-h200-2026-11-29.md). The interpreter and a direct launch never show
it, so these tests compile each kernel for sm_90 on the CPU with eps typed as inductor types it and read
Triton's IR for fp64 tensors.
"""

from __future__ import annotations

import importlib.util
import inspect
import textwrap

import pytest

from samfast.kernels import bias_channel_norm, mask_downsample

triton = pytest.importorskip("triton")


def _compile_or_skip(fn, signature: dict[str, str], constexprs: dict[str, int]) -> str:
    """Triton's IR (TTIR) of fn compiled for an sm_90 GPU (no GPU needed), constexprs by name; skips
    where this Triton has no CUDA backend. A kernel that fails to compile fails the test."""
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if "nvidia" not in backends:
        pytest.skip(f"this Triton has no CUDA backend (backends: {sorted(backends)})")

    jit = JITFunction(fn)  # the kernels are plain functions (TritonKernel wraps them per call)
    names = jit.arg_names
    source = ASTSource(
        jit,
        signature={name: signature.get(name, "constexpr") for name in names},
        constexprs={(names.index(name),): value for name, value in constexprs.items()},
    )
    return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ttir"]


def fp64_tensor_ops(ttir: str) -> list[str]:
    """The lines of TTIR that compute on fp64 tensors (a scalar fp64 argument and its cast are fine)."""
    return [line.strip() for line in ttir.splitlines() if "xf64>" in line]


NORM_SIGNATURE = {"X": "*bf16", "ResidualBias": "*bf16", "W": "*bf16", "B": "*bf16", "Out": "*bf16", "M": "i32", "eps": "fp64"}
NORM_CONSTEXPRS = {"C": 144, "WIDE": 152, "BLOCK_C": 256, "BLOCK_M": 8}

DOWNSAMPLE_SIGNATURE = {
    **dict.fromkeys(["X", "W", "Bias", "NormW", "NormB", "Out"], "*fp32"),
    **dict.fromkeys(["stride_xb", "stride_xh", "stride_xw", "stride_xc", "H", "W_IN", "HO", "WO"], "i32"),
    "eps": "fp64",
}
DOWNSAMPLE_CONSTEXPRS = {"C": 4, "COUT": 16, "BLOCK_P": 64}


@pytest.mark.parametrize(
    "kernel, signature, constexprs",
    [
        (bias_channel_norm._norm_with_bias_channel_fwd, NORM_SIGNATURE, NORM_CONSTEXPRS),
        (mask_downsample._downsample_conv_fwd, DOWNSAMPLE_SIGNATURE, DOWNSAMPLE_CONSTEXPRS),
    ],
    ids=["norm_with_bias_channel", "downsample_conv"],
)
def test_fp64_eps_leaves_the_math_in_fp32(kernel, signature, constexprs):
    assert fp64_tensor_ops(_compile_or_skip(kernel, signature, constexprs)) == []


def _without_the_cast(fn, tmp_path):
    """fn with eps used as it arrives (the defect these tests guard against), from a module of its own
    (Triton reads a kernel's source from its file)."""
    source = textwrap.dedent(inspect.getsource(fn))
    cast = "tl.cast(eps, tl.float32)"
    assert cast in source, "the kernel no longer casts eps where this planted defect expects it"
    path = tmp_path / "planted_kernel.py"
    path.write_text("from samfast.kernels.dispatch import tl\n\n\n" + source.replace(cast, "eps"))
    spec = importlib.util.spec_from_file_location("planted_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, fn.__name__)


def test_planted_uncast_eps_is_caught(tmp_path):
    planted = _without_the_cast(bias_channel_norm._norm_with_bias_channel_fwd, tmp_path)
    found = fp64_tensor_ops(_compile_or_skip(planted, NORM_SIGNATURE, NORM_CONSTEXPRS))
    assert any("math.rsqrt" in line for line in found), found
