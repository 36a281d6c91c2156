"""Where a training step of tinysam.train spends its GPU time: encoder, decoder, loss, backward, optimizer.

    python -m bench.train_step_profile [--batch 16] [--prompts 8] [--steps 5] [--pool 64]

Builds the same model, data and step as `python -m tinysam.train` (seeded init, bf16 autocast,
SDPA attention, fused AdamW, compiled on the GPU) on a small scene pool, warms up, then profiles `--steps` steps with
torch.profiler and prints per-phase CUDA milliseconds and the top kernels.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from samfast import build_sam
from tinysam.data import BatchSampler, DeviceData, build_pool
from tinysam.loop import TrainingStep, prepare_for_training
from tinysam.optimizer import make_optimizer

PHASES = ("encoder", "decoder", "loss", "backward", "optimizer")  # train_step's profiler labels


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--pool", type=int, default=64)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="torch.compile the step, as tinysam.train does (default: on the GPU)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pool, _, _ = build_pool(args.pool, 0, args.workers)
    model = build_sam("vit_tiny", seed=0, device=device, stages="fp32")
    prepare_for_training(model)
    data = DeviceData(pool, device)
    sampler = BatchSampler(pool, args.batch, args.prompts, 0)
    compiled = device.type == "cuda" if args.compile is None else args.compile
    train_step = TrainingStep(model, make_optimizer(model, lr=1e-4, weight_decay=0.1), compiled)

    def step():
        train_step(data, sampler)

    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize()
    events = prof.key_averages()
    if device.type == "cuda":
        print(f"step: {start.elapsed_time(end) / args.steps:.1f} ms wall (CUDA events), "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    for phase in PHASES:
        e = next((e for e in events if e.key == phase), None)
        if e is not None:
            print(f"{phase:10s} cpu {e.cpu_time_total / 1e3 / args.steps:8.1f} ms   "
                  f"cuda {e.device_time_total / 1e3 / args.steps:8.1f} ms per step")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    main()
