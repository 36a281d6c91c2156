"""Benchmarks: the optimization ladder end to end (bench.ladder), the rel-pos attention kernels
(bench/kernel_bench.py) and the MLP's lin1 + GELU (bench/gelu_epilogue_bench.py)."""
