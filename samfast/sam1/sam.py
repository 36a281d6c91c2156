"""The Sam module: image encoder + prompt encoder + mask decoder, with SAM's pre- and post-processing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast.modeling.mask_decoder import MaskDecoder
from samfast.modeling.prompt_encoder import PromptEncoder
from samfast.modeling.static_batch import in_static_batches
from samfast.modeling.transformer import TwoWayTransformer
from samfast.quantize import encoder_linears
from samfast.sam1.config import IMAGE_SIZE, PATCH_SIZE, PIXEL_MEAN, PIXEL_STD, PROMPT_EMBED_DIM, ModelConfig
from samfast.sam1.image_encoder import ImageEncoderViT


class Sam(nn.Module):
    mask_threshold: float = 0.0
    image_format: str = "RGB"
    # Set by the compile switch: the encoder then only ever sees batches of this size.
    static_batch: int | None = None
    # The optimization switches applied (samfast.stages); empty for fp32.
    switches: frozenset[str] = frozenset()

    def __init__(self, image_encoder: ImageEncoderViT, prompt_encoder: PromptEncoder, mask_decoder: MaskDecoder) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.prompt_encoder = prompt_encoder
        self.mask_decoder = mask_decoder
        self.register_buffer("pixel_mean", torch.tensor(PIXEL_MEAN).view(-1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(PIXEL_STD).view(-1, 1, 1), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    @property
    def dtype(self) -> torch.dtype:
        return self.prompt_encoder.dtype

    # --- what the stage switches act on (samfast.stages asks; another family answers the same questions)
    def attention_modules(self) -> dict[str, nn.Module]:
        """Every attention module with an `attn_impl` (the sdpa switch's), encoder then decoder, by qualified name."""
        return {name: m for name, m in self.named_modules() if hasattr(m, "attn_impl")}

    def memory_cross_attentions(self) -> dict[str, nn.Module]:
        """The attentions to a video memory that the sdpa switch splits by memory frame: SAM 1 has no memory."""
        return {}

    def mask_downsamplers(self) -> dict[str, nn.Module]:
        """The mask downsamplers the triton switch fuses: SAM 1 has no memory encoder."""
        return {}

    def bias_channel_blocks(self) -> dict[str, nn.Module]:
        """The encoder blocks whose norm writes a channel of ones for the next GEMMs' biases: SAM 2's (its
        Hiera's first stages); SAM 1's ViT is wide enough for cuBLASLt's bias epilogue."""
        return {}

    def rewrite_encoder_for_compile(self) -> None:
        """SAM 2 rewrites parts of its encoder here as the compile switch compiles it; SAM 1's has none."""

    def triton_attention_modules(self) -> dict[str, nn.Module]:
        """The encoder attentions the triton switch puts on a kernel: every one (their decomposed rel-pos
        bias fused, kernels.relpos_attention)."""
        return {f"{name}.attn": block.attn for name, block in self.encoder_blocks().items()}

    def encoder_blocks(self) -> dict[str, nn.Module]:
        """The encoder's transformer blocks, by qualified name: bf16 must hold between them."""
        return {f"image_encoder.blocks.{i}": block for i, block in enumerate(self.image_encoder.blocks)}

    def encoder_linears(self) -> dict[str, nn.Linear]:
        """The linears the int8, fp8 and sparse switches replace (inside the encoder's blocks), by qualified name."""
        return {f"image_encoder.{name}": m for name, m in encoder_linears(self.image_encoder).items()}

    def encoder_mlps(self) -> list[nn.Module]:
        """The encoder's MLP blocks, whose GELU path (`gelu_impl`) the switches choose."""
        return [block.mlp for block in self.image_encoder.blocks]

    def patch_embedding(self) -> nn.Module:
        return self.image_encoder.patch_embed

    def prompt_decoder(self) -> MaskDecoder:
        """The mask decoder: prompts in, masks out (its upscaling and cross attention are switched, and it is compiled)."""
        return self.mask_decoder

    def compile_prompt_path(self) -> None:
        """The compile switch's graph of the mask decoder, for any prompt and image count."""
        self.prompt_decoder().compile_for_any_prompt_count()

    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """Image embeddings (N, 256, 64, 64) of preprocessed (N, 3, 1024, 1024) images.

        With a static batch size, every encoder call gets exactly that many images (zero-padded,
        or split), so a compiled encoder sees one shape and never recompiles.
        """
        return in_static_batches(self.image_encoder, images, self.static_batch)

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize (in fp32) and pad to a square input of the encoder's size, in the model's dtype."""
        x = (x.float() - self.pixel_mean) / self.pixel_std
        h, w = x.shape[-2:]
        x = F.pad(x, (0, self.image_encoder.img_size - w, 0, self.image_encoder.img_size - h))
        return x.to(self.dtype)

    def postprocess_masks(
        self, masks: torch.Tensor, input_size: tuple[int, ...], original_size: tuple[int, ...]
    ) -> torch.Tensor:
        """Upscale low-res logits to the original image size (in fp32), dropping the padding."""
        masks = F.interpolate(
            masks.float(), (self.image_encoder.img_size,) * 2, mode="bilinear", align_corners=False
        )
        masks = masks[..., : input_size[0], : input_size[1]]
        return F.interpolate(masks, tuple(original_size), mode="bilinear", align_corners=False)


def build_sam_modules(config: ModelConfig) -> Sam:
    """An uninitialised Sam of the given shape (weights come from a checkpoint)."""
    grid = IMAGE_SIZE // PATCH_SIZE
    return Sam(
        image_encoder=ImageEncoderViT(
            img_size=IMAGE_SIZE,
            patch_size=PATCH_SIZE,
            embed_dim=config.embed_dim,
            depth=config.depth,
            num_heads=config.num_heads,
            out_chans=PROMPT_EMBED_DIM,
            window_size=config.window_size,
            global_attn_indexes=config.global_attn_indexes,
        ),
        prompt_encoder=PromptEncoder(
            embed_dim=PROMPT_EMBED_DIM,
            image_embedding_size=(grid, grid),
            input_image_size=(IMAGE_SIZE, IMAGE_SIZE),
            mask_in_chans=16,
        ),
        mask_decoder=MaskDecoder(
            transformer_dim=PROMPT_EMBED_DIM,
            transformer=TwoWayTransformer(depth=2, embedding_dim=PROMPT_EMBED_DIM, mlp_dim=2048, num_heads=8),
            num_multimask_outputs=3,
            iou_head_depth=3,
            iou_head_hidden_dim=256,
        ),
    )
