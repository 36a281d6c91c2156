"""Time SAM's MLP first linear + GELU four ways at the vit_b and vit_h shapes, and check each.

    python bench/gelu_epilogue_bench.py [--out results.md]

Ways: F.linear then F.gelu (two kernels, what the encoder ran before), F.linear alone (the GEMM's
own time), samfast's fused op `linear_gelu_tanh` (one cuBLASLt GEMM with a tanh-GELU epilogue, what
the compile switch uses on a bf16 encoder) and inductor's max-autotune of linear + GELU. Inputs in
bf16; each output's max abs error is taken against float64 math with the exact and the tanh GELU
on the first 4096 rows. Times are triton.testing.do_bench medians.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

# name: (tokens M, in K, out N) of lin1: 64 x 64 tokens per image
SHAPES = {"vit_b, 32 images": (32 * 4096, 768, 3072), "vit_h, 8 images": (8 * 4096, 1280, 5120)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="-", help="markdown file to write (default stdout)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gelu_epilogue_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from samfast.modeling.common import linear_gelu_tanh

    lines = [
        f"MLP lin1 + GELU, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}; do_bench median; "
        "errors vs float64 math on 4096 rows.",
        "",
        "| shape | way | ms | TFLOP/s | max abs err vs exact GELU | vs tanh GELU |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, (M, K, N) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) * K**-0.5).bfloat16()
        b = (torch.randn(N, device="cuda", generator=g) * 0.1).bfloat16()
        pre = F.linear(x[:4096].double(), w.double(), b.double())
        exact, tanh = F.gelu(pre), F.gelu(pre, approximate="tanh")
        ways = {
            "linear then gelu (2 kernels)": lambda: F.gelu(F.linear(x, w, b)),
            "linear alone": lambda: F.linear(x, w, b),
            "linear_gelu_tanh (cuBLASLt epilogue)": lambda: linear_gelu_tanh(x, w, b),
            "inductor max-autotune linear + gelu": torch.compile(
                lambda: F.gelu(F.linear(x, w, b)), mode="max-autotune-no-cudagraphs"
            ),
        }
        for way, fn in ways.items():
            ms = do_bench(fn, warmup=50, rep=300)
            errors = ["n/a", "n/a"]
            if way != "linear alone":
                out = fn()[:4096].double()
                errors = [f"{(out - ref).abs().max().item():.4f}" for ref in (exact, tanh)]
            lines.append(f"| {name} | {way} | {ms:.3f} | {2 * M * K * N / ms / 1e9:.0f} | {errors[0]} | {errors[1]} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out != "-":
        with open(args.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
