"""The optimization ladder: one switch per optimization, parsed from a `stages=` string and applied to a Sam.

A single name means the cumulative ladder up to it, as in the published work ("sdpa" is
bf16 + compile + sdpa); names joined with "+" select exactly those switches ("bf16+sdpa+int8").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn

from samfast.errors import StageError
from samfast.quantize import quantize_linears

LADDER = ("fp32", "bf16", "compile", "sdpa", "triton", "nt", "int8", "sparse")
# fp8 is a sibling of int8, not a rung above it: both quantize the same encoder linears, so a
# cumulative ladder would stack one quantization on the other. The name "fp8" alone means the
# lossless stack (bf16 .. nt) plus the fp8 switch, as the published sparse branch hangs off nt.
FP8 = "fp8"
SWITCHES = (*LADDER, FP8)
LOSSLESS_STACK = "nt"
# The ladder's `sparse` includes int8, and int8 + 2:4 needs torchao's int8 semi-sparse layout,
# which torchao 0.18 no longer has: there 2:4 is measured on the lossless stack instead.
SPARSE_WITHOUT_INT8 = "bf16+compile+sdpa+triton+nt+sparse"


class SwitchTarget(Protocol):
    """What a family's model offers for apply_stages to switch it (SAM 1's samfast.sam1.sam.Sam, SAM 2's
    samfast.sam2.SAM2Base): each switch asks it for the modules it acts on and sets their flags, so a
    family whose model answers these takes every switch unedited. A family without such a part (SAM 1 has
    no memory) answers with an empty dict. parity.checks.switch_proofs checks what each switch left behind.

    The modules answered carry the flags the switches set: attention modules `attn_impl` ("math", "sdpa",
    "triton"); memory cross-attentions `split_by_memory_frame` and `key_impl`; mask downsamplers
    `conv_impl`; bias-channel blocks `bias_as_channel`; encoder MLPs `gelu_impl`; the patch embedding
    `as_gemm`; the prompt decoder `upscale_impl` and `transformer.fused_cross_attention`.
    """

    image_encoder: nn.Module  # compiled whole by the compile switch, its linears quantized in place
    switches: frozenset[str]  # set by apply_stages: the switches the model was built with

    @property
    def device(self) -> torch.device: ...

    def parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter (nn.Module's): the bf16 switch casts them; buffers stay fp32."""

    def attention_modules(self) -> dict[str, nn.Module]:
        """Every attention of the image path with an `attn_impl` (the sdpa switch's)."""

    def triton_attention_modules(self) -> dict[str, nn.Module]:
        """The encoder attentions the triton switch puts on a kernel (those whose shapes it takes)."""

    def memory_cross_attentions(self) -> dict[str, nn.Module]:
        """The memory attention's cross-attentions (tracking's; the sdpa and triton switches)."""

    def mask_downsamplers(self) -> dict[str, nn.Module]:
        """The memory encoder's mask downsamplers, whose convs the triton switch fuses."""

    def bias_channel_blocks(self) -> dict[str, nn.Module]:
        """The encoder blocks whose norm writes a channel of ones for the biases under the triton switch."""

    def encoder_blocks(self) -> dict[str, nn.Module]:
        """The image encoder's blocks, by qualified name: the bf16 switch's proof holds the dtype between them."""

    def encoder_linears(self) -> dict[str, nn.Linear]:
        """The encoder linears the int8, sparse and fp8 switches quantize, by name."""

    def encoder_mlps(self) -> list[nn.Module]:
        """The encoder blocks' MLPs, whose GELU path (`gelu_impl`) the compile and triton switches choose."""

    def patch_embedding(self) -> nn.Module:
        """The patch conv the compile switch runs as a GEMM (`as_gemm`)."""

    def prompt_decoder(self) -> nn.Module | None:
        """The mask decoder: its upscaling path, its fused cross attentions, the nt switch's batched calls. None
    for a family whose prompts go through no SAM-style mask decoder (SAM 3's detector), which then takes
    neither the triton nor the nt switch."""

    def compile_prompt_path(self) -> None:
        """Compile what runs per prompt, for every prompt count (SAM 1 and 2: the mask decoder's
        compile_for_any_prompt_count; SAM 3: its text encoder and detector)."""

    def rewrite_encoder_for_compile(self) -> None:
        """The family's rewrites of its encoder made as the compile switch compiles it (none: a no-op)."""


def parse_stages(stages: str) -> frozenset[str]:
    """The set of switches a `stages=` string selects (fp32, the baseline, is the empty set)."""
    names = [n.strip() for n in stages.split("+")] if stages else []
    unknown = [n for n in names if n not in SWITCHES]
    if unknown or not names:
        raise StageError(
            f"unknown stage {', '.join(map(repr, unknown)) or repr(stages)}; choose from {' < '.join(LADDER)} "
            f"or {FP8} (one name = the ladder up to it; {FP8} = {LOSSLESS_STACK} + {FP8}) or join switches "
            "with '+', e.g. 'bf16+sdpa+int8'"
        )
    if names == [FP8]:
        return parse_stages(LOSSLESS_STACK) | {FP8}
    if len(names) == 1:
        return frozenset(LADDER[1 : LADDER.index(names[0]) + 1])
    # "fp32" in a combination names the baseline explicitly: "fp32+nt" is the nt switch alone.
    switches = frozenset(names) - {"fp32"}
    if FP8 in switches and switches & {"int8", "sparse"}:
        raise StageError(
            f"{stages!r}: fp8 replaces the same encoder linears as int8 and 2:4 sparse; choose one of them, "
            f"e.g. '{FP8}' or 'int8'"
        )
    return switches


def canonical_name(switches: frozenset[str]) -> str:
    """The shortest name for a switch set: a ladder name when it is a ladder prefix, else 'a+b+c'."""
    for name in SWITCHES:
        if switches == parse_stages(name):
            return name
    joined = "+".join(n for n in SWITCHES if n in switches)
    # a lone switch name would parse back as the ladder up to it: name the baseline explicitly
    return joined if "+" in joined else f"fp32+{joined}"


def apply_stages(model: SwitchTarget, switches: frozenset[str]) -> None:
    """Change `model` in place into the requested stage. Order matters: dtype, weights, then compile.

    Each switch asks the model for the modules it acts on (SwitchTarget), so a family that offers the
    same accessors takes every switch unedited. What each switch must leave behind is checked by
    parity.checks.switch_proofs.
    """
    if "bf16" in switches:
        # Parameters only: the buffers (pixel mean/std, positional Gaussian) stay fp32 on purpose.
        for param in model.parameters():
            param.data = param.data.to(torch.bfloat16)
    attn = "sdpa" if "sdpa" in switches else "math"
    for module in model.attention_modules().values():
        module.attn_impl = attn
    for module in model.memory_cross_attentions().values():
        module.split_by_memory_frame = "sdpa" in switches  # samfast.sam2.memory.attention.attention_by_memory_frame
    decoder = model.prompt_decoder()
    if "triton" in switches:
        for module in model.triton_attention_modules().values():
            module.attn_impl = "triton"
        decoder.upscale_impl = "triton"  # the upscaling and mask product fused: kernels.upscaled_masks
        decoder.transformer.fused_cross_attention = True  # kernels.decoder_attention
        for module in model.memory_cross_attentions().values():
            module.key_impl = "triton"  # the memory's keys projected and rotated at once: kernels.rotated_keys
        for module in model.mask_downsamplers().values():
            module.conv_impl = "triton"  # each mask conv with its norm and GELU: kernels.downsample_conv
        for block in model.bias_channel_blocks().values():
            block.bias_as_channel = True  # the norm writes a channel of ones for the biases: kernels.norm_with_bias_channel
    if switches & {"int8", "sparse", FP8}:
        quantize_linears(model.image_encoder, model.encoder_linears(), int8="int8" in switches,
                         sparse="sparse" in switches, fp8=FP8 in switches)
    if "triton" in switches and switches & {FP8, "int8"} and "sparse" not in switches:
        # lin1's GELU and lin2's activation quantization in one pass: kernels.gelu_quantize (an
        # int8 2:4 weight, where torchao still has one, is another tensor type: not for this path)
        for mlp in model.encoder_mlps():
            mlp.gelu_impl = "quantized_kernel"
    if "compile" in switches:
        model.patch_embedding().as_gemm = True  # see PatchEmbed (each family's): cuDNN's conv for it is slow
        model.rewrite_encoder_for_compile()  # SAM 2's: the high-resolution levels, the positional table
        # likewise the decoder's transposed convs (kernels.upscaled_masks_reference; SAM 2's adds its
        # high-resolution levels between the two)
        if "triton" not in switches and decoder is not None:
            decoder.upscale_impl = "gemm"
        if "bf16" in switches and not switches & {"int8", "sparse", FP8}:
            # see MLPBlock: lin1 + GELU as one GEMM; the tanh GELU is within bf16's rounding, not fp32's,
            # and a quantized lin1 is no plain weight for cuBLASLt
            for mlp in model.encoder_mlps():
                mlp.gelu_impl = "epilogue"
        model.image_encoder.compile(mode=compile_mode(model.device), dynamic=False, fullgraph=True)
        model.compile_prompt_path()
    model.switches = switches


def compile_mode(device: torch.device) -> str:
    """max-autotune on the GPU (as published); plain inductor on the CPU, where autotuning only costs time."""
    return os.environ.get("SAMFAST_COMPILE_MODE") or ("max-autotune" if device.type == "cuda" else "default")
