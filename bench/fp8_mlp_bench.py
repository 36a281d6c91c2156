"""Time SAM's encoder MLP (lin1, GELU, lin2) in bf16 and fp8 at the vit_b and vit_h shapes, and check each.

    python bench/fp8_mlp_bench.py [--out results.md]

Ways, each compiled with inductor's default mode as the ladder bench compiles the encoder:
the bf16 MLP of the `nt` stack (lin1 + tanh GELU as one cuBLASLt GEMM, then lin2); the fp8 switch
as torchao builds it (rowwise scaled fp8 GEMMs; inductor fuses the GELU with lin2's activation
quantization, a looped reduction); and the fp8 switch with the triton switch's
kernels.gelu_quantize_fp8 (GELU + quantization in one pass, e4m3 rows straight into lin2's scaled
GEMM). The GELU + quantization step is also timed alone, kernel vs inductor. Errors: relative L2
of the MLP output against float64 math (exact GELU) on the first 4096 rows. Inputs bf16 N(0, 1),
weights N(0, 1 / K): seeded, synthetic. Times are triton.testing.do_bench medians.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.nn.functional as F
from torch import nn

# name: (tokens M, width, MLP width) of one block: 64 x 64 tokens per image
SHAPES = {"vit_b, 32 images": (32 * 4096, 768, 3072), "vit_h, 8 images": (8 * 4096, 1280, 5120)}


def fp8_mlp(mlp: nn.Module, gelu_impl: str) -> nn.Module:
    """A copy of `mlp` with the fp8 switch's quantization (samfast.quantize) and this GELU path."""
    from samfast.quantize import quantize_encoder

    holder = nn.Module()  # quantize_encoder takes the encoder's block linears: blocks.N.mlp.lin1 ...
    holder.blocks = nn.ModuleList([nn.Module()])
    holder.blocks[0].mlp = copy.deepcopy(mlp)
    quantize_encoder(holder, int8=False, sparse=False, fp8=True)
    holder.blocks[0].mlp.gelu_impl = gelu_impl
    return holder.blocks[0].mlp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="-", help="markdown file to write (default stdout)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("fp8_mlp_bench: needs a CUDA GPU of compute capability >= 8.9", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from samfast import kernels
    from samfast.modeling.common import MLPBlock
    from samfast.quantize import FP8_AMAX_FLOOR

    lines = [
        f"SAM encoder MLP, {torch.cuda.get_device_name()}, torch {torch.__version__}; seeded synthetic weights; "
        "inductor default mode; do_bench median; error: relative L2 vs float64 math (exact GELU) on 4096 rows.",
        "",
        "| shape | way | ms | rel. L2 error |",
        "|---|---|---:|---:|",
    ]
    for name, (M, C, N) in SHAPES.items():
        torch.manual_seed(0)
        mlp = MLPBlock(C, N).cuda().requires_grad_(False)
        with torch.no_grad():
            for lin in (mlp.lin1, mlp.lin2):
                lin.weight.normal_(0, lin.in_features**-0.5)
                lin.bias.normal_(0, 0.1)
        x = torch.randn(M, C, device="cuda").bfloat16()
        want = copy.deepcopy(mlp).double()(x[:4096].double())
        bf16 = copy.deepcopy(mlp).bfloat16()
        bf16.gelu_impl = "epilogue"
        mlps = {
            "bf16, GELU in lin1's epilogue (nt)": bf16,
            "fp8, torchao + inductor (fp8 before)": fp8_mlp(mlp.bfloat16(), "module"),
            "fp8, kernels.gelu_quantize_fp8 (fp8 + triton)": fp8_mlp(mlp.bfloat16(), "fp8_kernel"),
        }
        h = F.linear(x, mlp.lin1.weight, mlp.lin1.bias)
        gelu_quant = {
            "GELU + quantize alone: kernel": lambda: kernels.gelu_quantize_fp8(h, FP8_AMAX_FLOOR),
            "GELU + quantize alone: inductor": torch.compile(
                lambda: kernels.gelu_quantize_fp8_reference(h, FP8_AMAX_FLOOR), fullgraph=True
            ),
        }
        for way, module in mlps.items():
            fn = torch.compile(module, fullgraph=True)
            with torch.no_grad():
                got = fn(x)[:4096].double()
                err = ((got - want).norm() / want.norm()).item()
                ms = do_bench(lambda: fn(x), warmup=50, rep=300)
            lines.append(f"| {name} | {way} | {ms:.3f} | {err:.4f} |")
            print(lines[-1], flush=True)
        for way, fn in gelu_quant.items():
            ms = do_bench(fn, warmup=50, rep=300)
            lines.append(f"| {name} | {way} | {ms:.3f} | - |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out != "-":
        with open(args.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
