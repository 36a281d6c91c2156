"""Why is 2:4 sparse slower than dense on this GPU? Time one encoder linear several ways.

    python -m bench.sparse_diagnosis [--model vit_b] [--images 8] [--out sparse.md]

For each block linear shape of the encoder (qkv, proj, lin1, lin2) at M = images x 64 x 64 tokens,
bf16, 2:4-pruned weight, this separates what the call costs on the host from what the kernel
costs on the GPU:

  dense              F.linear, dense weight (triton do_bench median, eager)
  cslt eager         F.linear with the cuSPARSELt semi-structured weight, eager (what torch runs)
  cslt graph         the same call replayed in a CUDA graph (do_bench_cudagraph): host work gone
  cslt kernel        CUDA kernel time per call from the profiler; host us per call beside it
  cslt searched      torch._cslt_sparse_mm with the alg_id from torch._cslt_sparse_mm_search
  cutlass            F.linear with the CUTLASS semi-structured weight (or why it cannot run)

If `cslt graph` is far below `cslt eager`, the slowness is host-side per-call work inside the op,
which CUDA graphs (compile's cudagraph modes) remove.
Every way is checked against the dense product of the same pruned weight.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from samfast.sam1.config import MODEL_CONFIGS
from samfast.quantize import SPARSE_BACKENDS, prune_2_4, to_semi_structured


def linear_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(K, N) of the encoder's block linears."""
    dim = MODEL_CONFIGS[model].embed_dim
    return {"qkv": (dim, 3 * dim), "proj": (dim, dim), "lin1": (dim, 4 * dim), "lin2": (4 * dim, dim)}


def profile_per_call(fn, calls: int = 20) -> tuple[float, float]:
    """(GPU kernel us, host us) per call of fn, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernel_us = sum(e.device_time_total for e in events if e.device_time_total and not e.key.startswith("aten::")
                    and "Memcpy" not in e.key and "Memset" not in e.key)
    host_us = max(e.cpu_time_total for e in events if e.key.startswith("aten::"))
    return kernel_us / calls, host_us / calls


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def diagnose(name: str, M: int, K: int, N: int) -> dict:
    from triton.testing import do_bench, do_bench_cudagraph

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, generator=g, device="cuda").bfloat16()
    w = prune_2_4(torch.randn(N, K, generator=g, device="cuda").bfloat16())
    b = torch.randn(N, generator=g, device="cuda").bfloat16()
    ref = F.linear(x, w, b)
    row = {"linear": f"{name} {K}->{N}", "M": M, "dense us": 1e3 * do_bench(lambda: F.linear(x, w, b), return_mode="median")}
    sparse = to_semi_structured(w, "cusparselt")

    def cslt():
        return F.linear(x, sparse, b)

    row["cslt err"] = rel_err(cslt(), ref)
    row["cslt eager us"] = 1e3 * do_bench(cslt, return_mode="median")
    row["cslt graph us"] = 1e3 * do_bench_cudagraph(cslt, return_mode="median")
    row["cslt kernel us"], row["cslt host us"] = profile_per_call(cslt)
    try:  # cuSPARSELt's own algorithm search, which torch's semi-structured tensor never runs
        packed = sparse.packed
        alg = torch._cslt_sparse_mm_search(packed, x.t(), b, transpose_result=True)

        def searched():
            return torch._cslt_sparse_mm(packed, x.t(), b, transpose_result=True, alg_id=alg)

        out = searched()
        row["searched alg"] = alg
        row["cslt searched us"] = 1e3 * do_bench(searched, return_mode="median")
        row["searched err"] = rel_err(out if out.shape == ref.shape else out.t(), ref)
    except Exception as err:  # noqa: BLE001 - report, keep the other columns
        row["searched alg"], row["cslt searched us"], row["searched err"] = "-", _why(err), "-"
    try:
        cutlass = to_semi_structured(w, "cutlass")
        row["cutlass us"] = 1e3 * do_bench(lambda: F.linear(x, cutlass, b), return_mode="median")
    except Exception as err:  # noqa: BLE001 - report why CUTLASS cannot run here
        row["cutlass us"] = _why(err)
    return row


def _why(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:80] if lines else ''}"


def markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sparse_diagnosis", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_b", choices=sorted(MODEL_CONFIGS))
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--out", help="also write the markdown table here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench.sparse_diagnosis needs a CUDA GPU")
    M = args.images * 64 * 64
    rows = []
    for name, (K, N) in linear_shapes(args.model).items():
        print(f"timing {name} ({M}x{K} @ {K}x{N}) ...", file=sys.stderr, flush=True)
        rows.append(diagnose(name, M, K, N))
    header = (f"# 2:4 sparse vs dense, {args.model} encoder linears, {torch.cuda.get_device_name()}, torch "
              f"{torch.__version__}, cuSPARSELt {torch.backends.cusparselt.version()}, backends {', '.join(SPARSE_BACKENDS)}\n\n")
    text = header + markdown(rows) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
