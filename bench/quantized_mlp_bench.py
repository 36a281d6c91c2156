"""Time SAM's encoder MLP (lin1, GELU, lin2) in bf16, fp8 and int8 at the vit_b and vit_h shapes, and check each.

    python bench/quantized_mlp_bench.py [--out results.md] [--compile-mode MODE]

Ways, each compiled as the ladder bench compiles the encoder (inductor's default mode unless
--compile-mode): the bf16 MLP of the `nt` stack (lin1 + tanh GELU as one cuBLASLt GEMM, then
lin2); the fp8 and int8 switches as torchao builds them (rowwise scaled fp8 GEMMs / int8 GEMMs;
inductor fuses the GELU with lin2's activation quantization, a looped reduction); and each with the
triton switch's kernels.gelu_quantize (GELU + quantization in one pass, quantized rows straight
into lin2's GEMM). The GELU + quantization step is also timed alone, kernel vs inductor. Errors: relative L2
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


class OneMLP(nn.Module):
    """One MLP named as in an encoder (blocks.0.mlp.lin1 ...), where quantize.encoder_linears finds its linears."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Module()])
        self.blocks[0].mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0].mlp(x)


def compiled_mlp(mlp: nn.Module, switch: str, gelu_impl: str, mode: str) -> nn.Module:
    """A compiled copy of `mlp` with this switch's quantization (samfast.quantize; none for bf16) and GELU path."""
    from samfast.quantize import encoder_linears, quantize_linears

    torch._dynamo.reset()  # one compiled instance at a time: dynamo would count each as a recompile
    one = OneMLP(copy.deepcopy(mlp))
    if switch != "bf16":
        quantize_linears(one, encoder_linears(one), int8=switch == "int8", sparse=False, fp8=switch == "fp8")
    one.blocks[0].mlp.gelu_impl = gelu_impl
    one.compile(mode=mode, fullgraph=True)  # int8: with the switch's own inductor flags
    return one


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="-", help="markdown file to write (default stdout)")
    p.add_argument("--compile-mode", default="default", help="torch.compile mode (default: default)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("quantized_mlp_bench: needs a CUDA GPU of compute capability >= 8.9", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from samfast import kernels
    from samfast.modeling.common import MLPBlock
    from samfast.quantize import ACTIVATION_AMAX_FLOOR as FLOOR

    lines = [
        f"SAM encoder MLP, {torch.cuda.get_device_name()}, torch {torch.__version__}; seeded synthetic weights; "
        f"compile mode {args.compile_mode}; do_bench median; error: relative L2 vs float64 math (exact GELU) on 4096 rows.",
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
        mlp.bfloat16()
        ways = {"bf16, GELU in lin1's epilogue (nt)": ("bf16", "epilogue")}
        for switch in ("fp8", "int8"):
            ways[f"{switch}, torchao + inductor"] = (switch, "module")
            ways[f"{switch}, kernels.gelu_quantize"] = (switch, "quantized_kernel")
        h = F.linear(x, mlp.lin1.weight, mlp.lin1.bias)
        gelu_quant = {}
        for dtype in (torch.float8_e4m3fn, torch.int8):
            target = str(dtype).removeprefix("torch.")
            gelu_quant[f"GELU + quantize to {target} alone: kernel"] = lambda d=dtype: kernels.gelu_quantize(h, d, FLOOR)
            gelu_quant[f"GELU + quantize to {target} alone: inductor"] = torch.compile(
                lambda d=dtype: kernels.gelu_quantize_reference(h, d, FLOOR), fullgraph=True
            )
        for way, (switch, gelu_impl) in ways.items():
            fn = compiled_mlp(mlp, switch, gelu_impl, args.compile_mode)
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
