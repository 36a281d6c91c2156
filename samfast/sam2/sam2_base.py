"""SAM2Base: the modules of a SAM 2 checkpoint, with sam2's names, its image path and its tracking step.

Holds everything an official checkpoint holds, so it loads strictly: the image encoder, the SAM
heads, and the video parts (memory encoder and attention, memory and object-pointer embeddings).
The image path is sam2's forward_image and _prepare_backbone_features, plus `image_features`,
what SAM2ImagePredictor.set_image keeps. The tracking step (track_step and what it calls) is
mixed in from samfast.sam2.tracker; samfast.VideoPredictor drives it over a video.
"""

from __future__ import annotations

import torch
from torch import nn

from samfast.kernels.window_attention import fits as fits_window_kernel
from samfast.modeling.common import bias_as_channel_pays
from samfast.sam2.backbones.hiera import Hiera, PatchEmbed
from samfast.sam2.backbones.image_encoder import ImageEncoder
from samfast.modeling.static_batch import in_static_batches
from samfast.sam2.backbones.neck import FpnNeck
from samfast.sam2.config import (
    BACKBONE_STRIDE,
    D_MODEL,
    IMAGE_SIZE,
    MEM_DIM,
    MEMORY_ATTENTION_LAYERS,
    NUM_MASKMEM,
    Sam2Config,
)
from samfast.sam2.memory.attention import MemoryAttention
from samfast.sam2.memory.encoder import MemoryEncoder
from samfast.modeling.sam2_prompting.mlp import MLP
from samfast.modeling.sam2_prompting.mask_decoder import Sam2MaskDecoder
from samfast.modeling.sam2_prompting.prompt_encoder import Sam2PromptEncoder
from samfast.modeling.sam2_prompting.transformer import Sam2TwoWayTransformer
from samfast.sam2.tracker import SAM2Tracking, TrackingSettings


class SAM2Base(SAM2Tracking, nn.Module):
    image_size = IMAGE_SIZE
    # Every config: the first frame (and so a single image) gets no_mem_embed added to its
    # lowest-resolution features instead of memory attention, and the decoder reads the two
    # higher-resolution levels too.
    directly_add_no_mem_embed = True
    use_high_res_features_in_sam = True
    num_feature_levels = 3
    # with the compile switch: the encoder's one batch size (samfast.modeling.static_batch)
    static_batch: int | None = None

    def __init__(
        self,
        config: Sam2Config,
        image_encoder: ImageEncoder,
        memory_attention: MemoryAttention,
        memory_encoder: MemoryEncoder,
        sam_prompt_encoder: Sam2PromptEncoder,
        sam_mask_decoder: Sam2MaskDecoder,
    ) -> None:
        super().__init__()
        self.config = config
        self.image_encoder = image_encoder
        self.hidden_dim = image_encoder.neck.d_model
        self.mem_dim = MEM_DIM
        self.num_maskmem = NUM_MASKMEM
        self.memory_attention = memory_attention
        self.memory_encoder = memory_encoder
        # the video parts' parameters, under sam2's names (zeros here: weights come from a checkpoint)
        self.mask_downsample = nn.Conv2d(1, 1, kernel_size=4, stride=4)
        self.maskmem_tpos_enc = nn.Parameter(torch.zeros(NUM_MASKMEM, 1, 1, MEM_DIM))
        self.no_mem_embed = nn.Parameter(torch.zeros(1, 1, self.hidden_dim))
        self.no_mem_pos_enc = nn.Parameter(torch.zeros(1, 1, self.hidden_dim))
        self.no_obj_ptr = nn.Parameter(torch.zeros(1, self.hidden_dim))
        # SAM 2.1 only: an embedding for frames without the object, and projected temporal encodings
        self.no_obj_embed_spatial = nn.Parameter(torch.zeros(1, MEM_DIM)) if config.sam2_1 else None
        self.sam_prompt_encoder = sam_prompt_encoder
        self.sam_mask_decoder = sam_mask_decoder
        self.obj_ptr_proj = MLP(self.hidden_dim, self.hidden_dim, self.hidden_dim, 3)
        self.obj_ptr_tpos_proj = nn.Linear(self.hidden_dim, MEM_DIM) if config.sam2_1 else nn.Identity()
        # what sam2's yaml configs set for the tracking step (samfast.sam2.tracker)
        self.tracking = TrackingSettings.for_version(config.sam2_1)

    @property
    def device(self) -> torch.device:
        return self.no_mem_embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.no_mem_embed.dtype

    # --- what the stage switches act on: the questions samfast.sam1.sam.Sam answers, for SAM 2's
    # image path (the memory attention and encoder are video's: samfast.sam2.video_predictor.compile_tracking)
    def attention_modules(self) -> dict[str, nn.Module]:
        """Every attention module with an `attn_impl` (the sdpa switch's): Hiera's, then the decoder's."""
        return {name: m for name, m in self.named_modules() if hasattr(m, "attn_impl")}

    def memory_cross_attentions(self) -> dict[str, nn.Module]:
        """The memory attention's cross-attentions, which the sdpa switch splits by memory frame
        (samfast.sam2.memory.attention.attention_by_memory_frame; only tracking runs them)."""
        return {f"memory_attention.layers.{i}.cross_attn_image": layer.cross_attn_image
                for i, layer in enumerate(self.memory_attention.layers)}

    def mask_downsamplers(self) -> dict[str, nn.Module]:
        """The memory encoder's mask downsampler, whose convs the triton switch fuses (kernels.downsample_conv)."""
        return {"memory_encoder.mask_downsampler": self.memory_encoder.mask_downsampler}

    def triton_attention_modules(self) -> dict[str, nn.Module]:
        """The encoder attentions the triton switch puts on a kernel: Hiera's whose windows fit
        kernels.window_attention (the second stage's 4 x 4 windows); cuDNN keeps the larger ones."""
        return {f"{name}.attn": block.attn for name, block in self.encoder_blocks().items()
                if (tokens := block.window_tokens()) is not None and fits_window_kernel(*tokens)}

    def encoder_blocks(self) -> dict[str, nn.Module]:
        return {f"image_encoder.trunk.blocks.{i}": block for i, block in enumerate(self.image_encoder.trunk.blocks)}

    def bias_channel_blocks(self) -> dict[str, nn.Module]:
        """Hiera's blocks whose first norm the triton switch puts on kernels.norm_with_bias_channel, for
        their qkv and proj to take the biases as a channel: where that pays (bias_as_channel_pays), except
        the first block, whose norm inductor fuses with the making of the stream. Only the window-order
        stream reads the flag (Hiera.forward_windowed, the bf16 compiled path), so none where the windows
        pad the model's maps (every config but hiera_l's)."""
        trunk = self.image_encoder.trunk
        if not trunk.windows_tile(trunk.patch_embed.output_size((self.image_size, self.image_size))):
            return {}
        return {name: block for i, (name, block) in enumerate(self.encoder_blocks().items())
                if i > 0 and bias_as_channel_pays(block.attn.qkv)}

    def encoder_linears(self) -> dict[str, nn.Linear]:
        """The linears inside Hiera's blocks (attention, MLP, and the width-doubling residual projections)."""
        return {f"{name}.{sub}": m for name, block in self.encoder_blocks().items()
                for sub, m in block.named_modules() if isinstance(m, nn.Linear)}

    def encoder_mlps(self) -> list[nn.Module]:
        """Hiera's block MLPs, whose GELU path (`gelu_impl`, samfast.sam2.mlp.HieraMLP) the switches choose."""
        return [block.mlp for block in self.image_encoder.trunk.blocks]

    def patch_embedding(self) -> PatchEmbed:
        """Hiera's 7x7 stride-4 patch conv, which the compile switch runs as a GEMM over unfolded patches."""
        return self.image_encoder.trunk.patch_embed

    def prompt_decoder(self) -> Sam2MaskDecoder:
        return self.sam_mask_decoder

    def compile_prompt_path(self) -> None:
        """The compile switch's graph of the mask decoder, for any prompt and image count."""
        self.prompt_decoder().compile_for_any_prompt_count()

    def forward_image(self, img_batch: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """The image encoder's outputs, with the two high-resolution levels already projected by
        the decoder's conv_s0 / conv_s1 (once per image instead of once per prompt)."""
        backbone_out = in_static_batches(self.image_encoder, img_batch.to(self.dtype), self.static_batch)
        if not self.image_encoder.neck.high_res_heads:  # else the neck applied them (rewrite_encoder_for_compile)
            fpn = backbone_out["backbone_fpn"]
            fpn[0] = self.sam_mask_decoder.conv_s0(fpn[0])
            fpn[1] = self.sam_mask_decoder.conv_s1(fpn[1])
        return backbone_out

    def rewrite_encoder_for_compile(self) -> None:
        """The compile switch's rewrites of SAM 2's image encoder, made as it compiles it: the decoder's
        conv_s0 / conv_s1 folded into the neck's own 1x1 convs of those levels (FpnNeck.project_high_res),
        and Hiera's positional table resized by matrix products (hiera.resized_pos_embed_by_matmul)."""
        self.image_encoder.neck.project_high_res((self.sam_mask_decoder.conv_s0, self.sam_mask_decoder.conv_s1))
        self.image_encoder.trunk.pos_embed_by_matmul = True

    def _prepare_backbone_features(self, backbone_out: dict) -> tuple[dict, list, list, list]:
        """sam2's flattened view of the last num_feature_levels levels: (HW, B, C) features and
        positional encodings, with their sizes."""
        backbone_out = backbone_out.copy()
        feature_maps = backbone_out["backbone_fpn"][-self.num_feature_levels :]
        vision_pos_embeds = backbone_out["vision_pos_enc"][-self.num_feature_levels :]
        feat_sizes = [(x.shape[-2], x.shape[-1]) for x in vision_pos_embeds]
        vision_feats = [x.flatten(2).permute(2, 0, 1) for x in feature_maps]
        vision_pos_embeds = [x.flatten(2).permute(2, 0, 1) for x in vision_pos_embeds]
        return backbone_out, vision_feats, vision_pos_embeds, feat_sizes

    def image_features(self, img_batch: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(image embedding (B, 256, 64, 64) with no_mem_embed added, [stride-4, stride-8 features]):
        what the image predictor decodes prompts against."""
        backbone_out = self.forward_image(img_batch)
        _, vision_feats, _, feat_sizes = self._prepare_backbone_features(backbone_out)
        vision_feats[-1] = vision_feats[-1] + self.no_mem_embed
        batch = img_batch.shape[0]
        feats = [feat.permute(1, 2, 0).view(batch, -1, *size) for feat, size in zip(vision_feats, feat_sizes)]
        return feats[-1], feats[:-1]


def build_sam2_modules(config: Sam2Config, dynamic_multimask_via_stability: bool = True) -> SAM2Base:
    """An uninitialised SAM2Base of the given shape (weights come from a checkpoint)."""
    grid = IMAGE_SIZE // BACKBONE_STRIDE
    trunk = Hiera(
        embed_dim=config.embed_dim,
        num_heads=config.num_heads,
        stages=config.stages,
        global_att_blocks=config.global_att_blocks,
        window_pos_embed_bkg_spatial_size=config.window_pos_embed_bkg_spatial_size,
        window_spec=config.window_spec,
    )
    return SAM2Base(
        config,
        image_encoder=ImageEncoder(trunk, FpnNeck(D_MODEL, list(config.backbone_channel_list)), scalp=1),
        memory_attention=MemoryAttention(D_MODEL, MEMORY_ATTENTION_LAYERS, MEM_DIM),
        memory_encoder=MemoryEncoder(MEM_DIM, D_MODEL),
        sam_prompt_encoder=Sam2PromptEncoder(
            embed_dim=D_MODEL,
            image_embedding_size=(grid, grid),
            input_image_size=(IMAGE_SIZE, IMAGE_SIZE),
            mask_in_chans=16,
        ),
        sam_mask_decoder=Sam2MaskDecoder(
            transformer_dim=D_MODEL,
            transformer=Sam2TwoWayTransformer(depth=2, embedding_dim=D_MODEL, num_heads=8, mlp_dim=2048),
            dynamic_multimask_via_stability=dynamic_multimask_via_stability,
        ),
    )
