"""What kind of work a GPU kernel does, from the name the profiler gives it: a profile's time summed by kind
says at a glance where a call goes (GEMMs near cuBLAS's best, attention, inductor's fused memory-bound
kernels, samfast's own Triton kernels, copies), before its longest kernels say which.

    by_kind({"nvjet_sm90_tst_192x192_..._TNN": 6221.0, "triton_red_fused_native_layer_norm_0": 410.0})
    -> {"GEMM (cuBLAS / CUTLASS)": 6221.0, "inductor fused (triton_*)": 410.0}
"""

from __future__ import annotations

# (kind, name fragments), first match wins: attention first (cuDNN's attention kernels name their wgmma tiles
# and "fprop"), inductor's fused kernels before convolutions (triton_poi_fused_convolution_...), convolutions
# before GEMMs (cuDNN's implicit-GEMM convolutions). samfast's own Triton kernels are the names that begin
# with one underscore (_window_attention_fwd, ...): kind_of checks them before these.
KINDS = (
    ("attention (cuDNN / flash / efficient)", ("sdpa", "flash", "fmha")),
    ("inductor fused (triton_*)", ("triton_",)),
    ("convolution (cuDNN)", ("conv", "cudnn::cnn", "implicit_convolve", "fprop_implicit")),
    ("GEMM (cuBLAS / CUTLASS)", ("gemm", "nvjet", "cutlass", "xmma", "cublas")),
    ("copies and fills", ("memcpy", "memset", "catarraybatchedcopy", "copy_kernel", "fill_kernel")),
    ("ATen elementwise and reductions", ("elementwise_kernel", "reduce_kernel", "at::native")),
)
SAMFAST = "samfast Triton kernels"
OTHER = "other"


def kind_of(name: str) -> str:
    lowered = name.lower()
    if lowered.startswith("_") and not lowered.startswith("__"):  # a Triton kernel of samfast.kernels
        return SAMFAST
    for kind, fragments in KINDS:
        if any(fragment in lowered for fragment in fragments):
            return kind
    return OTHER


def by_kind(kernels: dict[str, float]) -> dict[str, float]:
    """Time per kernel name -> time per kind, the largest first."""
    totals: dict[str, float] = {}
    for name, time in kernels.items():
        kind = kind_of(name)
        totals[kind] = totals.get(kind, 0.0) + time
    return dict(sorted(totals.items(), key=lambda item: item[1], reverse=True))
