"""Time SAM's rel-pos attention three ways on the GPU and check each against float64 math.

    python bench/kernel_bench.py [--out results.md] [--dtype bf16|fp16] [--shapes vit_b_global,...] [--images 8] [--configs]

Ways: the fused Triton kernel (samfast.kernels.relpos_attention), SDPA with the (B, H, L, L) bias
materialized (timed with the bias build, as SAM runs it), and FlexAttention (compiled, a score_mod
adding rel_h[b, h, q, kv // kw] + rel_w[b, h, q, kv % kw]). Times are triton.testing.do_bench
medians; every way is checked against float64 math on a slice of the batch first, so a fast wrong
answer shows as such. Writes a markdown table to --out (default stdout).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    name: str
    B: int
    H: int
    kh: int
    kw: int
    D: int

    @property
    def L(self) -> int:
        return self.kh * self.kw


def shapes_for(images: int) -> dict[str, Shape]:
    """SAM's attention shapes for a batch of `images` (25 windows of 14 x 14 per 64 x 64 image)."""
    return {
        "vit_b_global": Shape(f"vit_b global ({images} img)", B=images, H=12, kh=64, kw=64, D=64),
        "vit_b_window": Shape(f"vit_b windowed ({images} img x 25 win)", B=images * 25, H=12, kh=14, kw=14, D=64),
        "vit_h_global": Shape(f"vit_h global ({images} img)", B=images, H=16, kh=64, kw=64, D=80),
        "vit_h_window": Shape(f"vit_h windowed ({images} img x 25 win)", B=images * 25, H=16, kh=14, kw=14, D=80),
    }

DEFAULT_SHAPES = "vit_b_global,vit_b_window,vit_h_global,vit_h_window"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_inputs(s: Shape, dtype, device="cuda", seed=0, rel_std=2.0):
    """qkv (3, B, H, L, D), a permuted view of one projection as SAM builds it; rel factors ~ N(0, rel_std)."""
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(s.B, s.L, 3, s.H, s.D, generator=g, device=device).to(dtype).permute(2, 0, 3, 1, 4)
    rel_h = (rel_std * torch.randn(s.B, s.H, s.L, s.kh, generator=g, device=device)).to(dtype)
    rel_w = (rel_std * torch.randn(s.B, s.H, s.L, s.kw, generator=g, device=device)).to(dtype)
    return qkv, rel_h, rel_w


def math_fp64(qkv, rel_h, rel_w, scale=None, chunk=4):
    """float64 attention with the bias written out; chunked over heads to bound memory."""
    q, k, v = qkv.unbind(0)
    B, H, L, D = q.shape
    kw = rel_w.shape[-1]
    scale = D**-0.5 if scale is None else scale
    j = torch.arange(L, device=q.device)
    out = torch.empty(B, H, L, D, dtype=torch.float64, device=q.device)
    for b in range(B):
        for h0 in range(0, H, chunk):
            sl = (b, slice(h0, h0 + chunk))
            qq, kk, vv = (t[sl].double() for t in (q, k, v))
            bias = rel_h[sl].double()[..., j // kw] + rel_w[sl].double()[..., j % kw]
            out[sl] = torch.softmax(qq @ kk.transpose(-1, -2) * scale + bias, dim=-1) @ vv
    return out


def sdpa_materialized(qkv, rel_h, rel_w):
    _, B, H, L, _ = qkv.shape
    bias = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(B, H, L, L)
    return F.scaled_dot_product_attention(*qkv.unbind(0), attn_mask=bias)


def make_flex(kw: int):
    from torch.nn.attention.flex_attention import flex_attention

    @torch.compile(dynamic=False, fullgraph=True)
    def run(qkv, rel_h, rel_w):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + rel_h[b, h, q_idx, kv_idx // kw] + rel_w[b, h, q_idx, kv_idx % kw]

        return flex_attention(*qkv.unbind(0), score_mod=score_mod)

    return run


def check(fn, inputs, n_check: int) -> tuple[float, float]:
    """(max abs error, max abs error / max |ref|) of fn's output on the first n_check batch items."""
    qkv, rel_h, rel_w = inputs
    out = fn(*inputs)[:n_check]
    ref = math_fp64(qkv[:, :n_check], rel_h[:n_check], rel_w[:n_check])
    err = (out.double() - ref).abs().max().item()
    return err, err / ref.abs().max().item()


def bench_shape(s: Shape, dtype, ways, n_check):
    from triton.testing import do_bench

    inputs = make_inputs(s, dtype)
    flops = 4 * s.B * s.H * s.L * s.L * s.D  # two matmuls
    rows = []
    for name, fn, exact in ways(s):
        t0 = time.perf_counter()
        try:
            fn(*inputs)  # compile / autotune
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            err, rel = check(fn, inputs, n_check) if exact else (float("nan"), float("nan"))
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn(*inputs)
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            ms = do_bench(lambda: fn(*inputs), warmup=25, rep=100, return_mode="median")
        except Exception as exc:  # report, keep going (e.g. an unsupported head dim)
            rows.append((s.name, name, "failed", "", "", "", "", f"{type(exc).__name__}: {str(exc)[:80]}"))
            continue
        rows.append(
            (
                s.name,
                name,
                f"{ms * 1e3:.0f}",
                f"{flops / ms / 1e9:.0f}",
                f"{peak:.2f}",
                f"{err:.2e}" if exact else "n/a",
                f"{rel:.2e}" if exact else "n/a",
                f"{first_s:.1f}",
            )
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="-", help="markdown file to write (default stdout)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated, from {sorted(shapes_for(1))}")
    p.add_argument(
        "--ways", default="triton,sdpa,flex,nobias", help="comma-separated subset of triton,sdpa,flex,nobias"
    )
    p.add_argument("--check-batch", type=int, default=1, help="batch items checked against float64 math")
    p.add_argument("--images", type=int, default=8, help="images per batch the shapes stand for (default 8)")
    p.add_argument("--configs", action="store_true", help="also time the kernel at each of its autotune configs alone")
    args = p.parse_args(argv)

    if not torch.cuda.is_available():
        print("kernel_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    import importlib

    from samfast.kernels import fallback_counts, relpos_attention

    rpa = importlib.import_module("samfast.kernels.relpos_attention")

    dtype = DTYPES[args.dtype]
    wanted = args.ways.split(",")

    def at_config(config):
        def run(qkv, rel_h, rel_w):
            out = rpa._empty_out(qkv[0])
            rpa._launch(qkv, rel_h, rel_w, out, qkv.shape[-1] ** -0.5, True, lambda kern: kern, config)
            return out

        return run

    def ways(s: Shape):
        if "triton" in wanted:
            yield "triton fused", relpos_attention, True
        if args.configs:
            for c in rpa._AUTOTUNE_CONFIGS:
                kw = c.kwargs
                name = f"triton {kw['BLOCK_M']}x{kw['BLOCK_N']} w{c.num_warps} s{c.num_stages}"
                yield name, at_config(c), True
        if "sdpa" in wanted:
            yield "SDPA + materialized bias", sdpa_materialized, True
        if "flex" in wanted:
            yield "FlexAttention (compiled)", make_flex(s.kw), True
        if "nobias" in wanted:
            # Not SAM's answer (no bias): the flash-attention speed a fused bias could approach.
            yield "SDPA without bias (speed bound only)", lambda qkv, rh, rw: F.scaled_dot_product_attention(*qkv.unbind(0)), False

    rows, tuned = [], []
    shapes = shapes_for(args.images)
    for key in args.shapes.split(","):
        rows += bench_shape(shapes[key], dtype, ways, args.check_batch)
        best = getattr(rpa._KERNEL.compiled, "best_config", None)
        if "triton" in wanted and best is not None:
            tuned.append(f"{shapes[key].name}: {best}")
        torch.cuda.empty_cache()

    dev = torch.cuda.get_device_name()
    lines = [
        f"Rel-pos attention, {args.dtype}, {dev}, torch {torch.__version__}; do_bench median; "
        f"error vs float64 math on {args.check_batch} batch item(s); peak = GiB one call allocates beyond its inputs (output included).",
        "",
        "| shape | way | us | TFLOP/s | peak GiB | max abs err | err / max abs ref | first call s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if tuned:
        lines += ["", "Triton autotune picked:"] + [f"- {t}" for t in tuned]
    if fallback_counts():
        lines += ["", f"WARNING: the kernel fell back to the reference path: {fallback_counts()}"]
    text = "\n".join(lines) + "\n"
    if args.out != "-":
        with open(args.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
