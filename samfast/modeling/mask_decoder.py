"""Mask decoder: output tokens attend to the image embedding; hypernetworks turn them into masks.

SAM 1's, and the base every family's decoder builds on (SAM 2's: samfast.modeling.sam2_prompting.mask_decoder): the
output tokens, the upscaling, the hypernetworks and the IoU head, and the padding that lets one
compiled graph take any prompt count."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from samfast import kernels

from .common import LayerNorm2d
from .transformer import TwoWayTransformer


class MaskDecoder(nn.Module):
    def __init__(
        self,
        *,
        transformer_dim: int,
        transformer: TwoWayTransformer,
        num_multimask_outputs: int = 3,
        iou_head_depth: int = 3,
        iou_head_hidden_dim: int = 256,
    ) -> None:
        super().__init__()
        self.transformer_dim = transformer_dim
        self.transformer = transformer
        self.num_multimask_outputs = num_multimask_outputs
        self.iou_token = nn.Embedding(1, transformer_dim)
        self.num_mask_tokens = num_multimask_outputs + 1
        self.mask_tokens = nn.Embedding(self.num_mask_tokens, transformer_dim)
        self.output_upscaling = nn.Sequential(
            nn.ConvTranspose2d(transformer_dim, transformer_dim // 4, kernel_size=2, stride=2),
            LayerNorm2d(transformer_dim // 4),
            nn.GELU(),
            nn.ConvTranspose2d(transformer_dim // 4, transformer_dim // 8, kernel_size=2, stride=2),
            nn.GELU(),
        )
        self.output_hypernetworks_mlps = nn.ModuleList(
            MLP(transformer_dim, transformer_dim, transformer_dim // 8, 3) for _ in range(self.num_mask_tokens)
        )
        self.iou_prediction_head = MLP(transformer_dim, iou_head_hidden_dim, self.num_mask_tokens, iou_head_depth)
        self.compiled_predict_masks = None  # set by compile_for_any_prompt_count (the compile switch)
        # How the upscaling and mask product run: "conv" (as the reference), "gemm" (the compile
        # switch; samfast.kernels.upscaled_masks_reference) or "triton" (the triton switch: one
        # fused kernel, samfast.kernels.upscaled_masks)
        self.upscale_impl = "conv"

    def compile_for_any_prompt_count(self) -> None:
        """torch.compile predict_masks into one graph for every prompt count and image count.

        Both counts vary from call to call, so they are marked dynamic; dynamo specializes sizes 0
        and 1, so `_predict_masks_compiled` pads each count to at least 2 (and always passes
        image_index, making the per-image call the same graph as the batched one). What fuses: the
        gathers of the image-side projections to the prompts with what follows them, layer norms,
        GELUs and the mask product.
        """
        self.compiled_predict_masks = torch.compile(self.predict_masks, fullgraph=True)

    def forward(
        self,
        image_embeddings: torch.Tensor,
        image_pe: torch.Tensor,
        sparse_prompt_embeddings: torch.Tensor,
        dense_prompt_embeddings: torch.Tensor,
        multimask_output: bool,
        image_index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Low-res mask logits (P, C, 256, 256) and IoU predictions (P, C) for P prompts.

        With image_index (P,), prompt p attends to image_embeddings[image_index[p]]: prompts of
        many images decode in one batch. Without it every prompt reads the single image, as in the reference.
        """
        args = (image_embeddings, image_pe, sparse_prompt_embeddings, dense_prompt_embeddings, image_index)
        if self.compiled_predict_masks is None:
            masks, iou_pred = self.predict_masks(*args)
        else:
            masks, iou_pred = self._predict_masks_compiled(*args)
        keep = slice(1, None) if multimask_output else slice(0, 1)
        return masks[:, keep], iou_pred[:, keep]

    def _predict_masks_compiled(self, image_embeddings, image_pe, sparse, dense, image_index):
        """The compiled predict_masks on counts padded to >= 2 and marked dynamic; outputs cut back."""
        num_prompts = sparse.shape[0]
        if image_index is None:  # one image for every prompt: the same as indexing image 0
            image_index = sparse.new_zeros(num_prompts, dtype=torch.long)
        (image_embeddings,), sparse, dense, image_index = padded_to_two([image_embeddings], sparse, dense, image_index)
        for tensor in (image_embeddings, sparse, dense, image_index):
            torch._dynamo.mark_dynamic(tensor, 0)
        masks, iou_pred = self.compiled_predict_masks(image_embeddings, image_pe, sparse, dense, image_index)
        return masks[:num_prompts], iou_pred[:num_prompts]

    def predict_masks(
        self,
        image_embeddings: torch.Tensor,
        image_pe: torch.Tensor,
        sparse_prompt_embeddings: torch.Tensor,
        dense_prompt_embeddings: torch.Tensor,
        image_index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        num_prompts = sparse_prompt_embeddings.shape[0]
        tokens = torch.cat((self.output_tokens(num_prompts), sparse_prompt_embeddings), dim=1)

        if dense_prompt_embeddings.shape[0] == 1 or dense_prompt_embeddings.stride(0) == 0:
            # One dense embedding for every prompt (no mask inputs: the broadcast no-mask embedding),
            # so the image side is the same for all prompts of an image: the transformer's first
            # layer works on each image once and gathers to the prompts (image_index) where they mix.
            if image_index is None:
                image_index = torch.zeros(num_prompts, dtype=torch.long, device=tokens.device)
            src = image_embeddings + dense_prompt_embeddings[:1]
        else:  # a mask input per prompt: each prompt's image side is its own
            if image_index is None:
                src = torch.repeat_interleave(image_embeddings, num_prompts, dim=0)
            else:
                src = image_embeddings.index_select(0, image_index)
            src, image_index = src + dense_prompt_embeddings, None
        _, c, h, w = src.shape
        b = num_prompts

        hs, src = self.transformer(src, image_pe, tokens, image_index=image_index)
        iou_token_out = hs[:, 0, :]
        mask_tokens_out = hs[:, 1 : (1 + self.num_mask_tokens), :]

        hyper_in = self.hypernetwork_inputs(mask_tokens_out)
        if self.upscale_impl == "triton":
            masks = kernels.upscaled_masks(src.view(b, h, w, c), self.output_upscaling, hyper_in)
        elif self.upscale_impl == "gemm":
            masks = kernels.upscaled_masks_reference(src.view(b, h, w, c), self.output_upscaling, hyper_in)
        else:
            upscaled = self.output_upscaling(src.transpose(1, 2).reshape(b, c, h, w))
            b, c, h, w = upscaled.shape
            masks = (hyper_in @ upscaled.view(b, c, h * w)).view(b, -1, h, w)
        return masks, self.iou_prediction_head(iou_token_out)

    def output_token_weights(self) -> list[torch.Tensor]:
        """The learned tokens put before the prompt's, in the order the transformer reads them."""
        return [self.iou_token.weight, self.mask_tokens.weight]

    def output_tokens(self, num_prompts: int) -> torch.Tensor:
        """output_token_weights for each of the prompts, (P, tokens, C), without a copy."""
        return torch.cat(self.output_token_weights(), dim=0).unsqueeze(0).expand(num_prompts, -1, -1)

    def hypernetwork_inputs(self, mask_tokens_out: torch.Tensor) -> torch.Tensor:
        """Each mask token (P, M, C) through its own hypernetwork MLP: (P, M, C / 8), what the masks are
        the product of with the upscaled image tokens."""
        return torch.stack([mlp(mask_tokens_out[:, i, :]) for i, mlp in enumerate(self.output_hypernetworks_mlps)], dim=1)


def padded_to_two(
    images: list[torch.Tensor], sparse: torch.Tensor, dense: torch.Tensor, image_index: torch.Tensor
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """A compiled decoder's inputs with the image count (every tensor of `images`, batch first) and the
    prompt count at least 2, which dynamo does not specialize: an image of zeros, never indexed, and a
    copy of the prompt, decoded and dropped (the caller cuts its outputs back)."""
    if images[0].shape[0] < 2:
        images = [torch.cat([x, torch.zeros_like(x)]) for x in images]
    if sparse.shape[0] < 2:
        sparse, image_index = torch.cat([sparse, sparse]), torch.cat([image_index, image_index])
        # expand, not cat: the usual dense embedding (no mask input) is a broadcast with batch
        # stride 0, and a contiguous copy here would fail the compiled graph's stride guard
        dense = dense.expand(2, -1, -1, -1)
    return images, sparse, dense, image_index


class MLP(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        hidden = [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(n, k) for n, k in zip([input_dim] + hidden, hidden + [output_dim]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)
