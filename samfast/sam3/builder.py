"""sam3's image-model builder under its own name and signature, so that sam3 code runs on samfast by
changing the import: `from samfast.sam3 import build_sam3_image_model, Sam3Processor`.

samfast downloads nothing and builds the inference model only: where sam3 would fetch sam3.pt from the
Hugging Face hub, or build a part samfast has not built yet, the call is refused with what to do.
"""

from __future__ import annotations

import torch

from samfast.build import build_sam
from samfast.checkpoint import CheckpointError
from samfast.sam3.checkpoint import MODEL_TYPE
from samfast.sam3.image_model import Sam3ImageModel
from samfast.sam3.tokenizer import build_tokenizer


def build_sam3_image_model(
    bpe_path: str | None = None,
    device: str | torch.device = "cuda" if torch.cuda.is_available() else "cpu",
    eval_mode: bool = True,
    checkpoint_path: str | None = None,
    load_from_HF: bool = True,
    enable_segmentation: bool = True,
    enable_inst_interactivity: bool = False,
    compile: bool = False,
    *,
    seed: int | None = None,
) -> Sam3ImageModel:
    """sam3.model_builder.build_sam3_image_model's model on samfast: sam3.pt at `checkpoint_path`,
    read strictly, or seeded synthetic weights with seed=N (samfast's one addition)."""
    if checkpoint_path is None and seed is None:
        why = ("load_from_HF=True would download sam3.pt from the Hugging Face hub (facebook/sam3), and samfast "
               "downloads nothing" if load_from_HF else "no checkpoint_path was given")
        raise CheckpointError(
            f"{why}: pass checkpoint_path= the sam3.pt you downloaded, or seeded weights need seed=N "
            "(build_sam3_image_model(checkpoint_path=None, seed=0))."
        )
    refused = {
        "eval_mode=False": not eval_mode,
        "enable_segmentation=False": not enable_segmentation,
    }
    if unbuilt := [name for name, asked in refused.items() if asked]:
        raise NotImplementedError(
            f"{', '.join(unbuilt)}: not built on samfast yet, which has SAM 3's inference image model with its "
            "mask head; leave these arguments at sam3's defaults."
        )
    # sam3's own path: fp32 with its attention through SDPA, compiled when asked (samfast's graphs: static
    # shapes, no recompile); samfast.build_sam("sam3", stages=...) takes the faster stages
    stages = "fp32+compile+sdpa" if compile else "fp32+sdpa"
    return build_sam(MODEL_TYPE, checkpoint_path, seed=seed, device=device, stages=stages,
                     tokenizer=build_tokenizer(bpe_path=bpe_path), enable_inst_interactivity=enable_inst_interactivity)
