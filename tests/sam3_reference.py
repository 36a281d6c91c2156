"""sam3 0.1.4, the SAM 3 reference, built and run on the CPU.

sam3 cannot run on a CPU as shipped: three of its lines ask for a CUDA device. The shims that route
them to the CPU live here and nowhere else (`on_cpu`, with a stand-in for the scikit-image that sam3's
hole filling imports on a CPU), applied by patching names for the length of a
block, never by editing site-packages; tests/unit/test_sam3_reference.py checks that each one is still
needed, so that each goes away once sam3 fixes its line. Two import-time side effects of sam3 are
undone too, since every fp32 comparison needs true fp32: `sam3.model_builder` turns TF32 on when it
finds an Ampere or later GPU, and `Sam3TrackerPredictor.__init__` enters bf16 autocast and never
leaves it.

No weights exist here: the models get sam3's own initialisation under torch.manual_seed(seed), and the
two text-encoder tensors sam3 leaves uninitialised get seeded values (seed_text_encoder).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from scipy import ndimage

from samfast.checkpoint import key_generator
from samfast.sam3.checkpoint import DETECTOR_PREFIX, INTERACTIVE_PREFIX, TRACKER_PREFIX, of_video_only
from samfast.sam3.tokenizer import bpe_vocab_path

# The text encoder's two tensors that sam3 allocates with torch.empty and never initialises (the
# checkpoint fills them): left as they are, they hold whatever memory held, NaN at times.
TEXT_ENCODER_EMPTY = (
    "backbone.language_backbone.encoder.positional_embedding",
    "backbone.language_backbone.encoder.text_projection",
)

# The layouts of sam3.pt and of the image model with and without interactivity, {key: [shape, dtype]},
# for the checkpoint tests that build no model; `python -m tests.sam3_reference` rewrites it and
# tests/unit/test_sam3_reference.py checks it against the models built here.
LAYOUTS_FILE = Path(__file__).resolve().parent / "fixtures" / "sam3_layouts.json"


def _tf32_flags() -> tuple[bool, bool]:
    # the legacy flags, the ones sam3 sets (reading them after a mix with fp32_precision would raise)
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def _set_tf32_flags(flags: tuple[bool, bool]) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def import_model_builder():
    """sam3.model_builder, imported with the TF32 flags as they were before: at import it runs
    `_setup_tf32()`, which sets both flags on when GPU 0 is Ampere or later, and `import sam3` of any
    of its modules imports it first (sam3/__init__.py does)."""
    saved = _tf32_flags()
    try:
        return importlib.import_module("sam3.model_builder")
    finally:
        _set_tf32_flags(saved)


# Here, at this module's import: a test that imports this module before sam3 (as every SAM 3 test does)
# finds sam3 imported already, and TF32 as it was.
import_model_builder()


class TorchWith:
    """The torch module with some functions replaced: patched in as one sam3 module's `torch` name, it
    changes what that module's code calls and nothing else in the process."""

    def __init__(self, **replacements: Callable):
        self._replacements = replacements

    def __getattr__(self, name: str):
        return self._replacements[name] if name in self._replacements else getattr(torch, name)


def _zeros_on_cpu(*size, device=None, **kwargs) -> torch.Tensor:
    # Replaces sam3/model/position_encoding.py:47, `tensors = torch.zeros((1, 1) + size, device="cuda")`
    # in PositionEmbeddingSine.__init__: a dummy input whose only use is to fill the positional cache
    # at precompute_resolution; the cache takes the dummy's device, so it must be the model's (the CPU).
    return torch.zeros(*size, device="cpu" if device == "cuda" else device, **kwargs)


def _tensor_unpinned(*args, **kwargs) -> torch.Tensor:
    # Replaces sam3/model/geometry_encoders.py:659, `scale = scale.pin_memory().to(...)` in
    # SequenceGeometryEncoder._encode_boxes (run by every prompt, text alone included): pinning needs
    # an accelerator, and on the CPU the next line's .to() is a no-op, so the unpinned tensor is the
    # same value. Only the tensors that module makes with torch.tensor get the no-op pin_memory.
    tensor = torch.tensor(*args, **kwargs)
    tensor.pin_memory = lambda *_, **__: tensor
    return tensor


def _coords_on_cpu(original: Callable) -> staticmethod:
    # Replaces the `device="cuda"` of sam3/model/decoder.py:281, `self._get_coords(feat_size, feat_size,
    # device="cuda")` in TransformerDecoder.__init__: the box-relative position bias's coordinate cache,
    # made once at build time, must be on the model's device (the CPU). Calls at run time pass the
    # boxes' device and go through unchanged.
    return staticmethod(lambda H, W, device: original(H, W, "cpu" if device == "cuda" else device))


def _scipy_label(image, return_num: bool = False):
    # Stands in for scikit-image's `label`, which sam3/perflib/connected_components.py:21 imports to find
    # a CPU mask's connected components (predict_inst fills small holes with them; on a GPU sam3 uses
    # cc_torch or its Triton kernel). Neither sam3 nor this project depends on scikit-image, and sam3 warns
    # and skips the filling without it. Its defaults (connectivity = ndim, background 0) are scipy's label
    # with a full 3 x 3 structure: the same components, numbered in the same raster order.
    labels, count = ndimage.label(image, structure=np.ones((3,) * image.ndim, dtype=bool))
    return (labels, count) if return_num else labels


@contextlib.contextmanager
def _scikit_image_stand_in() -> Iterator[None]:
    """skimage and skimage.measure with _scipy_label as label, in sys.modules for the block's length (only
    those two entries: whatever else the block imports stays); nothing when scikit-image is installed."""
    if importlib.util.find_spec("skimage") is not None:
        yield
        return
    measure = types.ModuleType("skimage.measure")
    measure.label = _scipy_label
    package = types.ModuleType("skimage")
    package.measure = measure
    sys.modules.update({"skimage": package, "skimage.measure": measure})
    try:
        yield
    finally:
        del sys.modules["skimage"], sys.modules["skimage.measure"]


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """The block builds and runs sam3's image model on the CPU: the three device shims, in force
    until the block ends (building needs the first two, every prompt the third), and a stand-in for
    scikit-image's label, with which predict_inst fills holes on a CPU."""
    position_encoding = importlib.import_module("sam3.model.position_encoding")
    geometry_encoders = importlib.import_module("sam3.model.geometry_encoders")
    decoder = importlib.import_module("sam3.model.decoder").TransformerDecoder
    with (
        mock.patch.object(position_encoding, "torch", TorchWith(zeros=_zeros_on_cpu)),
        mock.patch.object(geometry_encoders, "torch", TorchWith(tensor=_tensor_unpinned)),
        mock.patch.object(decoder, "_get_coords", _coords_on_cpu(decoder._get_coords)),
        _scikit_image_stand_in(),
    ):
        yield


def _autocast_state() -> tuple:
    return tuple(
        (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")
    )


def leave_tracker_autocast(tracker) -> None:
    """Leave the bf16 autocast that Sam3TrackerPredictor.__init__ entered ("keep using for the entire
    model process"): on a GPU every later fp32 computation in the thread would run in bf16."""
    tracker.bf16_context.__exit__(None, None, None)


def seed_text_encoder(model: torch.nn.Module, seed: int) -> None:
    """Fill the text encoder's torch.empty tensors (TEXT_ENCODER_EMPTY) with seeded values of the scale
    open_clip initialises them at: positional table std 0.01, projection std width**-0.5."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key in TEXT_ENCODER_EMPTY:
            param = params[key]
            std = 0.01 if key.endswith("positional_embedding") else param.shape[0] ** -0.5
            param.copy_(std * torch.randn(param.shape, generator=key_generator(seed, key)))


def build_reference_image_model(seed: int, enable_inst_interactivity: bool = False,
                                device: str = "cpu") -> torch.nn.Module:
    """sam3's full-size image model (Sam3Image) in eval mode, sam3's own initialisation under
    torch.manual_seed(seed) and the text encoder seeded (seed_text_encoder). On the CPU (built with the
    shims) run it inside `on_cpu()`; on "cuda" it is sam3 as shipped (its builder initialises on the CPU,
    then moves the model, so the weights are the CPU build's). enable_inst_interactivity adds the SAM 1
    task predictor (the tracker's prompt encoder and mask decoder) and the neck's second branch, as
    sam3.pt's image loader expects."""
    builder = import_model_builder()
    autocast_before = _autocast_state()
    shims = on_cpu() if device == "cpu" else contextlib.nullcontext()
    with shims, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = builder.build_sam3_image_model(
            bpe_path=str(bpe_vocab_path()),  # the vocab sam3's wheel lacks, from open_clip_torch
            device=device,
            checkpoint_path=None,
            load_from_HF=False,
            enable_inst_interactivity=enable_inst_interactivity,
        )
    if model.inst_interactive_predictor is not None:
        leave_tracker_autocast(model.inst_interactive_predictor.model)
    if _autocast_state() != autocast_before:
        raise RuntimeError(
            f"building sam3's image model changed the autocast state ({autocast_before} -> {_autocast_state()}): "
            "sam3 enters autocast somewhere new; leave it in tests/sam3_reference.py as leave_tracker_autocast does"
        )
    seed_text_encoder(model, seed)
    return model.eval().requires_grad_(False)


def official_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of an image model built with enable_inst_interactivity in sam3.pt's layout (the
    video model's: its detector is this image model, its tracker the interactive predictor's model)."""
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith(INTERACTIVE_PREFIX):
            state[TRACKER_PREFIX + key[len(INTERACTIVE_PREFIX):]] = value
        else:
            state[DETECTOR_PREFIX + key] = value
    return state


def build_reference_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    """A seeded full state dict in sam3.pt's layout: `detector.*` and `tracker.*` keys, what sam3.pt
    holds under "model"."""
    return official_state_dict(build_reference_image_model(seed, enable_inst_interactivity=True))


def layout(state: Mapping[str, torch.Tensor]) -> dict[str, list]:
    """{key: [shape, dtype name]} of a state dict, as LAYOUTS_FILE stores it."""
    return {key: [list(value.shape), str(value.dtype).removeprefix("torch.")] for key, value in sorted(state.items())}


def reference_layouts(seed: int = 0) -> dict[str, dict[str, list]]:
    """The three layouts of LAYOUTS_FILE, from the models built here."""
    interactive = build_reference_image_model(seed, enable_inst_interactivity=True)
    layouts = {"sam3.pt": layout(official_state_dict(interactive)), "image_interactive": layout(interactive.state_dict())}
    del interactive
    layouts["image"] = layout(build_reference_image_model(seed).state_dict())
    return layouts


def samfast_image_layout(layouts: Mapping[str, Mapping[str, list]], interactive: bool) -> dict[str, list]:
    """The layout of samfast's image model: sam3's, and with interactivity sam3's interactive one without
    the tracker's video parts, which samfast's image model does not hold (samfast.sam3.checkpoint)."""
    if not interactive:
        return dict(layouts["image"])
    return {key: entry for key, entry in layouts["image_interactive"].items()
            if not (key.startswith(INTERACTIVE_PREFIX) and of_video_only(key[len(INTERACTIVE_PREFIX):]))}


def write_layouts(layouts: Mapping[str, Mapping[str, list]], path: Path = LAYOUTS_FILE) -> None:
    """JSON with one key per line, so that a change of sam3's layout reads as a small diff."""
    blocks = []
    for name in sorted(layouts):
        rows = ",\n".join(f"{json.dumps(key)}: {json.dumps(entry)}" for key, entry in sorted(layouts[name].items()))
        blocks.append(f"{json.dumps(name)}: {{\n{rows}\n}}")
    path.write_text("{\n" + ",\n".join(blocks) + "\n}\n")


def read_layouts(path: Path = LAYOUTS_FILE) -> dict[str, dict[str, list]]:
    return json.loads(path.read_text())


if __name__ == "__main__":
    write_layouts(reference_layouts())
    print(f"wrote {LAYOUTS_FILE}")
