"""Sizes of SAM 3's image model, the numbers sam3 0.1.4's model_builder hard-codes, and a builder.

sam3.model_builder.build_sam3_image_model has no config file: each `_create_*` function fixes its
module's sizes. They are gathered here (SAM3_IMAGE), with a reduced set (SAM3_REDUCED) whose model
runs in well under a second on a CPU, for tests. Both share every option that is not a size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from samfast.sam3.detr_decoder import DetrDecoder
from samfast.sam3.fusion_encoder import FusionEncoder
from samfast.sam3.geometry_encoder import SequenceGeometryEncoder
from samfast.sam3.image_model import DetectorTransformer, Sam3ImageModel, VisionLanguageBackbone
from samfast.sam3.interactive import InteractiveHeads, InteractivePredictor
from samfast.sam3.neck import Sam3DualViTDetNeck
from samfast.sam3.scoring import DotProductScoring
from samfast.sam3.segmentation_head import UniversalSegmentationHead
from samfast.sam3.text import TextEncoder
from samfast.sam3.tokenizer import build_tokenizer
from samfast.sam3.vit import ViT

# Sam3Processor's input: a square of this many pixels (the aspect ratio is not kept), then
# (x - 0.5) / 0.5 per channel on [0, 1] pixels
IMAGE_SIZE = 1008
PIXEL_MEAN = (0.5, 0.5, 0.5)
PIXEL_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class Sam3Config:
    # vision trunk (_create_vit_backbone)
    image_size: int = IMAGE_SIZE
    pretrain_image_size: int = 336
    patch_size: int = 14
    vit_embed_dim: int = 1024
    vit_depth: int = 32
    vit_num_heads: int = 16
    vit_mlp_ratio: float = 4.625
    vit_window_size: int = 24
    vit_global_blocks: tuple[int, ...] = (7, 15, 23, 31)
    # neck (_create_vit_neck) and the detector's width, shared by every module after the trunk
    d_model: int = 256
    neck_scale_factors: tuple[float, ...] = (4.0, 2.0, 1.0, 0.5)
    # SAM3VLBackbone's scalp: the coarsest neck levels dropped before the detector sees them
    scalp: int = 1
    # the neck's second branch, which feeds the SAM 1 task predictor (enable_inst_interactivity)
    add_sam2_neck: bool = False
    # text encoder (_create_text_encoder)
    text_width: int = 1024
    text_heads: int = 16
    text_layers: int = 24
    context_length: int = 32
    vocab_size: int = 49408
    # detector transformer: every attention's heads and every FFN's width (encoder, decoder,
    # geometry encoder; the segmentation head's prompt attention has the same heads)
    num_heads: int = 8
    dim_feedforward: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    num_queries: int = 200
    scoring_mlp_dim: int = 2048
    geometry_layers: int = 3
    mask_upsampling_stages: int = 3

    @property
    def grid_size(self) -> int:
        """The trunk's tokens per side: 72 at 1008 px."""
        return self.image_size // self.patch_size


SAM3_IMAGE = Sam3Config()

# 112 px images (an 8 x 8 grid, windows of 4), two layers everywhere, width 32: the same code paths
# as SAM3_IMAGE (windowed and global blocks, tiled positions, padding in the text, every neck level)
SAM3_REDUCED = Sam3Config(
    image_size=112,
    pretrain_image_size=56,
    vit_embed_dim=64,
    vit_depth=2,
    vit_num_heads=4,
    vit_window_size=4,
    vit_global_blocks=(1,),
    d_model=32,
    text_width=64,
    text_heads=4,
    text_layers=2,
    num_heads=4,
    dim_feedforward=64,
    encoder_layers=2,
    decoder_layers=2,
    num_queries=10,
    scoring_mlp_dim=64,
    geometry_layers=2,
)

# The small SAM 3 meant to be embedded trained, as vit_tiny and the nano are: tinysam.train_concept trains
# it on generated scenes (docs/sam3.md says where that stands). 168 px images (a 12 x 12 grid, 48 x 48
# masks), four ViT blocks, width 48 after the trunk; the text encoder is 16 wide, as its token table (49408
# rows, the vocabulary sam3's tokenizer indexes) is half the file.
SAM3_TINY = Sam3Config(
    image_size=168,
    pretrain_image_size=56,
    vit_embed_dim=64,
    vit_depth=4,
    vit_num_heads=4,
    vit_window_size=4,
    vit_global_blocks=(1, 3),
    d_model=48,
    text_width=16,
    text_heads=2,
    text_layers=2,
    num_heads=3,
    dim_feedforward=128,
    encoder_layers=2,
    decoder_layers=3,
    num_queries=20,
    scoring_mlp_dim=128,
    geometry_layers=2,
)


# The model types: the official model, the reduced one the tests build in well under a second, and the
# small one to train
CONFIGS = {"sam3": SAM3_IMAGE, "sam3_reduced": SAM3_REDUCED, "sam3_tiny": SAM3_TINY}
MODEL_TYPES = tuple(CONFIGS)


def sam3_config(model_type: str) -> Sam3Config:
    if model_type not in CONFIGS:
        raise ValueError(f"unknown SAM 3 model type {model_type!r}; choose one of {', '.join(MODEL_TYPES)}")
    return CONFIGS[model_type]


def model_type_of(config: Sam3Config) -> str:
    """The model type whose sizes `config` holds (for messages)."""
    return next((name for name, c in CONFIGS.items() if c == config), "a SAM 3 of other sizes")


def build_image_model(
    config: Sam3Config = SAM3_IMAGE, tokenizer: Callable[..., torch.Tensor] | None = None,
    enable_inst_interactivity: bool = False,
) -> Sam3ImageModel:
    """samfast's SAM 3 image model at `config`'s sizes, in eval mode, with untrained weights: load a
    state dict into it (sam3's Sam3Image's, strictly).
    `tokenizer` defaults to open_clip's BPE tokenizer with sam3's settings. enable_inst_interactivity:
    also the neck's second branch and the tracker's heads for point and box prompts (predict_inst), as
    sam3's builder adds them."""
    c = config
    trunk = ViT(
        img_size=c.image_size,
        pretrain_img_size=c.pretrain_image_size,
        patch_size=c.patch_size,
        embed_dim=c.vit_embed_dim,
        depth=c.vit_depth,
        num_heads=c.vit_num_heads,
        mlp_ratio=c.vit_mlp_ratio,
        window_size=c.vit_window_size,
        global_att_blocks=c.vit_global_blocks,
    )
    neck = Sam3DualViTDetNeck(trunk, c.d_model, c.neck_scale_factors,
                              add_sam2_neck=c.add_sam2_neck or enable_inst_interactivity)
    text = TextEncoder(
        c.d_model,
        tokenizer if tokenizer is not None else build_tokenizer(c.context_length),
        width=c.text_width,
        heads=c.text_heads,
        layers=c.text_layers,
        context_length=c.context_length,
        vocab_size=c.vocab_size,
    )
    transformer = DetectorTransformer(
        FusionEncoder(c.d_model, c.encoder_layers, c.num_heads, c.dim_feedforward),
        DetrDecoder(c.d_model, c.decoder_layers, c.num_heads, c.dim_feedforward, c.num_queries),
    )
    model = Sam3ImageModel(
        backbone=VisionLanguageBackbone(neck, text, scalp=c.scalp),
        geometry_encoder=SequenceGeometryEncoder(c.d_model, c.num_heads, c.dim_feedforward, c.geometry_layers),
        transformer=transformer,
        segmentation_head=UniversalSegmentationHead(c.d_model, c.mask_upsampling_stages, c.num_heads),
        dot_prod_scoring=DotProductScoring(c.d_model, c.d_model, c.scoring_mlp_dim),
    )
    if enable_inst_interactivity:
        model.inst_interactive_predictor = InteractivePredictor(InteractiveHeads(c.d_model, c.image_size, c.patch_size))
    return model.eval()
