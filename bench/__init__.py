"""Benchmarks: the optimization ladder end to end (bench.ladder), the rel-pos attention kernels
(bench/kernel_bench.py), the MLP's lin1 + GELU (bench/gelu_epilogue_bench.py), the quantized
MLPs with and without kernels.gelu_quantize (bench/quantized_mlp_bench.py) and the mask decoder's
cross attentions with and without kernels.decoder_attention (bench/decoder_attention_bench.py)."""
