"""Benchmarks: the optimization ladder end to end (bench.ladder) and the rel-pos attention kernels (bench/kernel_bench.py)."""
