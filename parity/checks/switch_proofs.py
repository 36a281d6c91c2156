"""What each switch must leave behind: one proof per switch of samfast.stages, read off the built model and
what one run of it did (`RunTrace`, filled by parity.checks.exercised.watch_switches).

A switch that silently did nothing gives the fp32 numbers, so the accuracy gates pass it; only its traces
tell. A proof returns (exercised, one sentence): what it found, or which modules stayed behind. The model is
asked for its modules through the accessors samfast.stages uses (Sam.attention_modules, encoder_linears, ...),
so a second family is proven by the same code. A new switch is not done until PROOFS has its proof
(tests/unit/test_switch_proof.py holds every switch of samfast.stages.SWITCHES to one) and a planted defect.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import torch

NAMES_SHOWN = 4


@dataclass
class RunTrace:
    """What the stage's run did; the observers only store into containers filled before the run (exercised.py)."""

    sdpa: dict[str, bool] = field(default_factory=lambda: {"called": False})
    block_dtypes: dict[str, torch.dtype | None] = field(default_factory=dict)  # encoder block -> its output dtype
    holders_ran: dict[str, bool] = field(default_factory=dict)  # module holding a replaced linear -> it ran
    decoder_calls: dict[str, int] = field(default_factory=lambda: {"nested": 0, "per_image": 0})
    kernel_fallbacks: dict[str, int] = field(default_factory=dict)  # reason -> calls sent to the slow path
    graphs_compiled: int = 0


Proof = Callable[[torch.nn.Module, RunTrace, frozenset], "tuple[bool, str]"]


def names(items: list[str]) -> str:
    shown = ", ".join(items[:NAMES_SHOWN])
    return shown + (f" and {len(items) - NAMES_SHOWN} more" if len(items) > NAMES_SHOWN else "")


def linear_holders(model: torch.nn.Module, linears: dict[str, torch.nn.Module]) -> list[str]:
    """The modules whose forward uses these linears' weights (an MLP may call its lin2's weight directly,
    kernels.quantized_linear, so the holder's run is what shows the weight was used). A container
    without a forward (sam2's MLP keeps its linears in `layers`, a ModuleList) is skipped for its parent."""
    holders = []
    for name in linears:
        holder = name.rpartition(".")[0]
        while isinstance(model.get_submodule(holder), (torch.nn.ModuleList, torch.nn.ModuleDict)):
            holder = holder.rpartition(".")[0]
        holders.append(holder)
    return list(dict.fromkeys(holders))


def prove_bf16(model, run: RunTrace, switches: frozenset) -> tuple[bool, str]:
    params = dict(model.named_parameters())
    left = [name for name, p in params.items() if p.dtype != torch.bfloat16]
    if left:
        return False, f"bf16: {len(left)} of {len(params)} parameters stayed {params[left[0]].dtype}: {names(left)}"
    off = [f"{name} ({'never ran' if dtype is None else dtype})" for name, dtype in run.block_dtypes.items()
           if dtype != torch.bfloat16]
    if off:
        return False, f"bf16: {len(off)} of {len(run.block_dtypes)} encoder blocks gave no bf16 activations: {names(off)}"
    return True, f"bf16: {len(params)} parameters and the activations leaving {len(run.block_dtypes)} encoder blocks in bf16"


def prove_compile(model, run: RunTrace, switches: frozenset) -> tuple[bool, str]:
    if run.graphs_compiled == 0:
        return False, "torch.compile compiled no graph: the model ran eagerly (TORCHDYNAMO_DISABLE=1 or a fallback to eager)"
    return True, f"compile: {run.graphs_compiled} graph(s) compiled"


def prove_sdpa(model, run: RunTrace, switches: frozenset) -> tuple[bool, str]:
    """Every attention module on the SDPA path but those the triton switch takes, every memory cross-attention
    (SAM 2's) split by memory frame, and SDPA called."""
    taken = set(model.triton_attention_modules()) if "triton" in switches else set()
    modules = model.attention_modules()
    behind = defaultdict(list)  # the path a module stayed on -> its names
    for name, module in modules.items():
        if name not in taken and module.attn_impl != "sdpa":
            behind[module.attn_impl].append(name)
    if behind:
        count = sum(map(len, behind.values()))
        paths = "; ".join(f"on the {impl} path: {names(left)}" for impl, left in behind.items())
        return False, f"sdpa: {count} of {len(modules) - len(taken)} attention modules stayed {paths}"
    memory = model.memory_cross_attentions()
    if unsplit := [name for name, module in memory.items() if not module.split_by_memory_frame]:
        return False, f"sdpa: {len(unsplit)} of {len(memory)} memory cross-attentions not split by memory frame: {names(unsplit)}"
    if not run.sdpa["called"]:
        return False, "sdpa: the attention modules are set to SDPA, yet F.scaled_dot_product_attention never ran"
    return True, (f"sdpa: {len(modules) - len(taken)} attention modules on the SDPA path"
                  + (f" ({len(taken)} more taken by triton)" if taken else "")
                  + (f", {len(memory)} memory cross-attentions split by memory frame" if memory else "")
                  + "; F.scaled_dot_product_attention ran")


def prove_triton(model, run: RunTrace, switches: frozenset) -> tuple[bool, str]:
    """The encoder attentions the switch takes (SAM 1's rel-pos ones, Hiera's small windows), the decoder,
    SAM 2's memory keys and mask convs and Hiera-L's narrow first norms on their kernels, and no call sent
    to a reference path."""
    behind = [name for name, module in model.triton_attention_modules().items() if module.attn_impl != "triton"]
    decoder = model.prompt_decoder()
    if decoder.upscale_impl != "triton":
        behind.append("prompt decoder's upscaling")
    if not decoder.transformer.fused_cross_attention:
        behind.append("prompt decoder's cross attention")
    memory = model.memory_cross_attentions()
    behind += [f"{name} (keys)" for name, module in memory.items() if module.key_impl != "triton"]
    behind += [f"{name} (convs)" for name, module in model.mask_downsamplers().items() if module.conv_impl != "triton"]
    norms = model.bias_channel_blocks()
    behind += [f"{name} (first norm)" for name, block in norms.items() if not block.bias_as_channel]
    if behind:
        return False, f"triton: {len(behind)} module(s) stayed off the Triton kernels: {names(behind)}"
    if run.kernel_fallbacks:
        reasons = ", ".join(f"{n}x {reason}" for reason, n in run.kernel_fallbacks.items())
        return False, f"a Triton kernel fell back to its reference path ({reasons})"
    return True, (f"triton: {len(model.triton_attention_modules())} encoder attentions, the decoder's upscaling "
                  "and cross attention" + (f", {len(memory)} memory cross-attentions' keys and the mask downsampler's "
                                           "convs" if memory else "")
                  + (f", {len(norms)} blocks' first norms with the bias channel" if norms else "")
                  + " on the Triton kernels; no call fell back")


def prove_nt(model, run: RunTrace, switches: frozenset) -> tuple[bool, str]:
    """The decoder called with the nested prompts of a whole batch (image_index), never image by image."""
    nested, per_image = run.decoder_calls["nested"], run.decoder_calls["per_image"]
    if per_image or not nested:
        return False, (f"nt: {per_image} of {nested + per_image} prompt-decoder calls decoded one image's prompts, "
                       "not a batch's nested prompts")
    return True, f"nt: {nested} prompt-decoder call(s), each with the nested prompts of a whole batch"


def _replaced_linears(switch: str, what: str, is_replaced: Callable[[torch.Tensor], bool]) -> Proof:
    """The proof of a switch that replaces the encoder linears' weights: each one replaced, and its holder ran."""

    def prove(model, run: RunTrace, switches: frozenset) -> tuple[bool, str]:
        linears = model.encoder_linears()
        left = [name for name, linear in linears.items() if not is_replaced(linear.weight)]
        if left:
            return False, f"{switch}: {len(left)} of {len(linears)} encoder linears stayed without {what} weights: {names(left)}"
        idle = [name for name, ran in run.holders_ran.items() if not ran]
        if idle:
            return False, f"{switch}: the modules holding the {what} weights never ran: {names(idle)}"
        return True, f"{switch}: {len(linears)} encoder linears hold {what} weights, and their modules ran"

    return prove


def _quantized_as(dtype: torch.dtype) -> Callable[[torch.Tensor], bool]:
    """torchao's quantized weights (Int8Tensor, Float8Tensor) keep their quantized values in `qdata`."""
    return lambda weight: getattr(weight, "qdata", None) is not None and weight.qdata.dtype == dtype


def _semi_structured(weight: torch.Tensor) -> bool:
    return isinstance(weight, torch.sparse.SparseSemiStructuredTensor)


PROOFS: dict[str, Proof] = {
    "bf16": prove_bf16,
    "compile": prove_compile,
    "sdpa": prove_sdpa,
    "triton": prove_triton,
    "nt": prove_nt,
    "int8": _replaced_linears("int8", "int8 (torchao)", _quantized_as(torch.int8)),
    "sparse": _replaced_linears("sparse", "2:4 semi-structured", _semi_structured),
    "fp8": _replaced_linears("fp8", "fp8 e4m3 (torchao)", _quantized_as(torch.float8_e4m3fn)),
}
