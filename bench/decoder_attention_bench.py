"""Time the mask decoder over a segment-everything batch with and without the folded cross-attention kernels.

    python bench/decoder_attention_bench.py [--prompts 1024] [--out results.md]

SAM's decoder (the same for every model type) in bf16 as the triton stage builds it, compiled
(inductor's default mode), one image embedding and --prompts point prompts, as the generator
decodes a 32x32 grid: the whole decoder call with TwoWayTransformer.fused_cross_attention off (the
module path: per-prompt projections, cuDNN attention, out_proj, residual, layer norm) and on
(kernels.decoder_attention); and each cross attention alone at per-prompt keys, module path
compiled vs kernel. Errors: the masks' max difference relative to the largest mask logit, and the
share of mask pixels whose sign differs. Seeded synthetic weights and embeddings; times are
triton.testing.do_bench medians.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=1024)
    p.add_argument("--out", default="-", help="markdown file to write (default stdout)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("decoder_attention_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    import samfast
    from samfast import kernels

    os.environ["SAMFAST_COMPILE_MODE"] = "default"
    torch.manual_seed(0)
    model = samfast.build_sam("vit_b", device="cuda", stages="triton", batch_size=1)
    decoder, prompt_encoder = model.mask_decoder, model.prompt_encoder
    n = args.prompts
    embedding = torch.randn(1, 256, 64, 64, device="cuda", dtype=torch.bfloat16)
    points = torch.rand(n, 1, 2, device="cuda") * 1024
    with torch.no_grad():
        sparse, dense = prompt_encoder(points=(points, torch.ones(n, 1, dtype=torch.int, device="cuda")), boxes=None, masks=None)
        pe = prompt_encoder.get_dense_pe()
        index = torch.zeros(n, dtype=torch.long, device="cuda")
        lines = [
            f"# decoder cross attention, {n} prompts, bf16 ({torch.cuda.get_device_name()}, torch {torch.__version__})",
            "",
            "| what | way | ms | max error / max of the module path | mask signs differing |",
            "|---|---|---:|---:|---:|",
        ]
        outputs = {}
        for fused in (False, True):
            decoder.transformer.fused_cross_attention = fused
            run = lambda: decoder(embedding, pe, sparse, dense, True, index)  # noqa: E731
            outputs[fused] = run()[0].float()
            ms = do_bench(run, warmup=10, rep=100)
            err = sign = "-"
            if fused:
                err = f"{((outputs[True] - outputs[False]).abs().max() / outputs[False].abs().max()).item():.2e}"
                sign = f"{((outputs[True] > 0) != (outputs[False] > 0)).float().mean().item():.2e}"
            lines.append(f"| mask decoder call | {'kernels' if fused else 'module path'} | {ms:.2f} | {err} | {sign} |")
            print(lines[-1], flush=True)

        layer = decoder.transformer.layers[1]
        keys = torch.randn(n, 64 * 64, 256, device="cuda", dtype=torch.bfloat16)
        key_pe = pe.flatten(2).transpose(1, 2).to(torch.bfloat16)
        tokens = torch.randn(n, 7, 256, device="cuda", dtype=torch.bfloat16)
        to_image, to_token, norm = layer.cross_attn_token_to_image, layer.cross_attn_image_to_token, layer.norm4
        ways = {
            "token -> image attention": (
                torch.compile(kernels.token_to_image_attention_reference, fullgraph=True),
                kernels.token_to_image_attention,
                (to_image, tokens, keys, key_pe),
            ),
            "image -> token attention + out_proj + residual + norm": (
                torch.compile(kernels.image_to_token_attention_reference, fullgraph=True),
                kernels.image_to_token_attention,
                (to_token, norm, keys, key_pe, tokens, tokens),
            ),
        }
        for what, (module_path, kernel, inputs) in ways.items():
            want = module_path(*inputs).float()
            got = kernel(*inputs).float()
            err = ((got - want).abs().max() / want.abs().max()).item()
            for way, fn in (("module path, compiled", module_path), ("kernel", kernel)):
                ms = do_bench(lambda f=fn: f(*inputs), warmup=10, rep=100)
                lines.append(f"| {what} | {way} | {ms:.2f} | {err:.2e} | - |")
                print(lines[-1], flush=True)
    assert kernels.fallback_counts() == {}, kernels.fallback_counts()
    text = "\n".join(lines) + "\n"
    if args.out != "-":
        with open(args.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
