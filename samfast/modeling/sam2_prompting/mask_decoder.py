"""SAM 2's mask decoder (sam2.modeling.sam.mask_decoder.MaskDecoder) as every SAM 2 config builds it.

Built on the shared decoder (samfast.modeling.mask_decoder.MaskDecoder: its tokens, upscaling,
hypernetworks, IoU head and padding), it adds: an object-score token and a 3-layer MLP head that
says whether the object is in the image; the high-resolution backbone levels (strides 4 and 8,
projected by conv_s0 / conv_s1) added into the two upscaling steps; IoU predictions through a
sigmoid; the multimask tokens as the object pointer tokens when three masks are asked for; and
(build_sam2's apply_postprocessing) a single mask that falls back to the best of the three when it
is unstable. Every config (2.0 and 2.1) turns all of these on, so they are not options here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from samfast import kernels
from samfast.kernels.decoder_attention import TOO_MANY_TOKENS, max_fused_tokens
from samfast.kernels.dispatch import note_fallback
from samfast.modeling.mask_decoder import MaskDecoder, padded_to_two
from samfast.modeling.sam2_prompting.mlp import MLP
from samfast.modeling.sam2_prompting.transformer import Sam2TwoWayTransformer

# build_sam2's apply_postprocessing=True (and SAM 3's tracker): one mask falls back to the best of three
# when unstable
DYNAMIC_MULTIMASK_STABILITY_DELTA = 0.05
DYNAMIC_MULTIMASK_STABILITY_THRESH = 0.98

# the fewest prompts in a call that the triton switch's cross attentions take (_fills_fused_kernels):
# below it the module path was faster (docs/measurements/amg/decoder-fused-threshold-h100-2026-11-26.md)
MIN_FUSED_PROMPTS = 32


class Sam2MaskDecoder(MaskDecoder):
    def __init__(
        self,
        *,
        transformer_dim: int,
        transformer: Sam2TwoWayTransformer,
        num_multimask_outputs: int = 3,
        iou_head_depth: int = 3,
        iou_head_hidden_dim: int = 256,
        dynamic_multimask_via_stability: bool = True,
    ) -> None:
        super().__init__(transformer_dim=transformer_dim, transformer=transformer,
                         num_multimask_outputs=num_multimask_outputs, iou_head_depth=iou_head_depth,
                         iou_head_hidden_dim=iou_head_hidden_dim)
        self.obj_score_token = nn.Embedding(1, transformer_dim)
        self.conv_s0 = nn.Conv2d(transformer_dim, transformer_dim // 8, kernel_size=1)
        self.conv_s1 = nn.Conv2d(transformer_dim, transformer_dim // 4, kernel_size=1)
        self.pred_obj_score_head = MLP(transformer_dim, transformer_dim, 1, 3)
        self.dynamic_multimask_via_stability = dynamic_multimask_via_stability
        self.dynamic_multimask_stability_delta = DYNAMIC_MULTIMASK_STABILITY_DELTA
        self.dynamic_multimask_stability_thresh = DYNAMIC_MULTIMASK_STABILITY_THRESH
        # set by compile_for_any_prompt_count (the compile switch): {cross attentions fused: compiled graph}
        self.compiled_predict_masks: dict[bool, Callable] | None = None

    def compile_for_any_prompt_count(self) -> None:
        """torch.compile predict_masks into one graph for every image count, prompt count and points per prompt.

        All vary from call to call, so they are marked dynamic, not padded: padding points with
        label -1 would change the answer (a -1 point is still a token every other token attends to).
        Dynamo specializes sizes 0 and 1, so `_predict_masks_compiled` pads the image and prompt counts
        to at least 2; the tokens per prompt are at least 2 already (a point and sam2's padding point, or a box).

        Two graphs, each compiled on its first call: one with the cross attentions on the triton switch's
        kernels, for prompts of fewer than decoder_attention.max_fused_tokens tokens (segment everything's
        8; up to 8 points a prompt, `_max_fused_prompt_tokens`), and one on the module path for the rest
        (and for every call without the switch). Each is its own function, so dynamo caches them apart:
        the second graph is a first compile, never a recompile of the first.
        """
        self.transformer.pad_tokens_to_widest = True  # the kernels' widths constant, whatever the count
        self.compiled_predict_masks = {
            True: torch.compile(self._predict_masks_fused, fullgraph=True),
            False: torch.compile(self._predict_masks_unfused, fullgraph=True),
        }

    def _predict_masks_fused(self, *args):
        return self.predict_masks(*args, fused_cross_attention=True)

    def _predict_masks_unfused(self, *args):
        return self.predict_masks(*args, fused_cross_attention=False)

    def forward(
        self,
        image_embeddings: torch.Tensor,
        image_pe: torch.Tensor,
        sparse_prompt_embeddings: torch.Tensor,
        dense_prompt_embeddings: torch.Tensor,
        multimask_output: bool,
        repeat_image: bool,
        high_res_features: list[torch.Tensor],
        image_index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mask logits (B, M, 256, 256), IoU predictions (B, M), SAM output tokens (B, M or 1, C),
        object score logits (B, 1)); M is 3 with multimask_output, else 1. repeat_image: one
        image embedding for all B prompts (else one per prompt). image_index (B,) instead: prompt b
        reads image image_index[b]'s embedding and high-resolution features (prompts of several
        images in one call: the nt switch)."""
        # inside another compiled graph (the tracker's propagation heads) traced inline at that graph's shapes
        compiled = self.compiled_predict_masks is not None and not torch.compiler.is_compiling()
        predict = self._predict_masks_compiled if compiled else self.predict_masks
        masks, iou_pred, mask_tokens_out, object_score_logits = predict(
            image_embeddings, image_pe, sparse_prompt_embeddings, dense_prompt_embeddings, repeat_image, high_res_features,
            image_index,
        )
        if multimask_output:
            masks, iou_pred = masks[:, 1:], iou_pred[:, 1:]
            sam_tokens_out = mask_tokens_out[:, 1:]
        else:
            if self.dynamic_multimask_via_stability and not self.training:
                masks, iou_pred = self._dynamic_multimask_via_stability(masks, iou_pred)
            else:
                masks, iou_pred = masks[:, 0:1], iou_pred[:, 0:1]
            # the single-mask token is the one tracking is trained on
            sam_tokens_out = mask_tokens_out[:, 0:1]
        return masks, iou_pred, sam_tokens_out, object_score_logits

    def _predict_masks_compiled(self, image_embeddings, image_pe, sparse, dense, repeat_image, high_res_features,
                                image_index=None):
        """The compiled predict_masks on image and prompt counts padded to >= 2 and marked dynamic, always
        through image_index (so one graph serves one image, one image per prompt and the nt batch, as SAM
        1's decoder does); outputs cut back. Inductor fuses the gathers into the adds that read them."""
        num_prompts = sparse.shape[0]
        if image_index is None:
            # one image embedding serves every prompt whether repeated or not (the image predictor passes
            # repeat_image=False for a single prompt, True for several); else one image per prompt
            shared = repeat_image or image_embeddings.shape[0] == 1
            image_index = torch.zeros(num_prompts, dtype=torch.long, device=sparse.device) if shared else \
                torch.arange(num_prompts, device=sparse.device)
        (image_embeddings, *high_res_features), sparse, dense, image_index = padded_to_two(
            [image_embeddings, *high_res_features], sparse, dense, image_index)
        # one memory layout for the compiled graph, whatever produced the features: the image predictor's
        # embedding is channels-last with a batch stride of 256, the static batch's slice another one, and
        # dynamo guards on strides (a recompile on the H100 when they changed between calls)
        image_embeddings = image_embeddings.contiguous()
        high_res_features = [feat.contiguous() for feat in high_res_features]
        for tensor in (image_embeddings, *high_res_features, sparse, dense, image_index):
            torch._dynamo.mark_dynamic(tensor, 0)
        fused = self._fuses_cross_attention(num_prompts, sparse.shape[1])
        # the fused graph's token counts bounded for dynamo: a guard its trace makes inside that range (as
        # the empty padding at the kernels' full width did) fails its first compile, ConstraintViolationError,
        # not a later call with a recompile (tests/system/test_sam2_compile.py); min as well: max alone
        # fails in torch's value ranges ("not simple sympy type NoneType")
        bounds = {"min": 2, "max": self._max_fused_prompt_tokens()} if fused else {}
        torch._dynamo.mark_dynamic(sparse, 1, **bounds)
        outputs = self.compiled_predict_masks[fused](image_embeddings, image_pe, sparse, dense, False,
                                                     high_res_features, image_index)
        return tuple(out[:num_prompts] for out in outputs)

    def _max_fused_prompt_tokens(self) -> int:
        """The most prompt tokens the fused graph takes: the kernels' width less the object-score, IoU and
        mask tokens predict_masks puts before the prompt's, less one. At a count equal to the width the
        padding is empty, a case the traced ops tell apart (dynamo: "Not all values of ... <= 10 satisfy
        the generated guard 2048 != (768 + 128*...)"), which would be a second graph for that count."""
        output_tokens = self.obj_score_token.num_embeddings + self.iou_token.num_embeddings + self.num_mask_tokens
        return max_fused_tokens(self.transformer.final_attn_token_to_image.num_heads) - output_tokens - 1

    def _fuses_cross_attention(self, num_prompts: int, prompt_tokens: int) -> bool:
        """Whether a call of this many prompts of this many tokens takes the fused graph: with the triton switch
        on, prompts enough to fill the GPU (_fills_fused_kernels) and the tokens within the kernels' width;
        more tokens are counted as a fallback, as the kernels count it outside a compiled graph."""
        if not self._fills_fused_kernels(num_prompts):
            return False
        if prompt_tokens > self._max_fused_prompt_tokens():
            note_fallback("the decoder's cross attentions", TOO_MANY_TOKENS, "the module path")
            return False
        return True

    def _fills_fused_kernels(self, num_prompts: int) -> bool:
        """The triton switch's cross attentions for this many prompts: on, and prompts enough. The token-to-image
        kernel runs one program per prompt over all its image tokens, so a few prompts (a tracked frame's
        objects, one click) leave the GPU idle where the module path's attention spreads each prompt's
        image tokens over it (MIN_FUSED_PROMPTS)."""
        return self.transformer.fused_cross_attention and num_prompts >= MIN_FUSED_PROMPTS

    def predict_masks(
        self,
        image_embeddings: torch.Tensor,
        image_pe: torch.Tensor,
        sparse_prompt_embeddings: torch.Tensor,
        dense_prompt_embeddings: torch.Tensor,
        repeat_image: bool,
        high_res_features: list[torch.Tensor],
        image_index: torch.Tensor | None = None,
        fused_cross_attention: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """All four masks and IoUs, the mask tokens and the object score logits. fused_cross_attention:
        the transformer's cross attentions on the kernels or not (None: as the triton switch and the
        prompt count say, _fills_fused_kernels)."""
        num_prompts = sparse_prompt_embeddings.shape[0]
        if fused_cross_attention is None:
            fused_cross_attention = self._fills_fused_kernels(num_prompts)
        tokens = torch.cat((self.output_tokens(num_prompts), sparse_prompt_embeddings), dim=1)

        per_image = image_index is not None and (dense_prompt_embeddings.shape[0] == 1 or dense_prompt_embeddings.stride(0) == 0)
        if per_image:
            # One dense embedding for every prompt (no mask inputs: the broadcast no-mask embedding), so
            # the transformer's first layer works on each image once and gathers to the prompts where
            # they mix, as SAM 1's decoder does (segment everything: 1 image, 1024 prompts)
            src, transformer_index = image_embeddings + dense_prompt_embeddings[:1], image_index
        else:
            if image_index is not None:
                src = image_embeddings.index_select(0, image_index)
            elif repeat_image:
                src = torch.repeat_interleave(image_embeddings, num_prompts, dim=0)
            else:
                src = image_embeddings
            src, transformer_index = src + dense_prompt_embeddings, None
        h, w = src.shape[-2:]

        # image_pe (1, C, h, w) broadcasts over the images or prompts (sam2 repeats it per prompt: the same
        # sums; the fused cross attentions need it unrepeated)
        hs, src = self.transformer(src, image_pe, tokens, image_index=transformer_index, fused=fused_cross_attention)
        iou_token_out = hs[:, 1, :]
        mask_tokens_out = hs[:, 2 : 2 + self.num_mask_tokens, :]

        hyper_in = self.hypernetwork_inputs(mask_tokens_out)
        masks = self._upscaled_masks(src, (h, w), hyper_in, high_res_features, image_index)
        iou_pred = torch.sigmoid(self.iou_prediction_head(iou_token_out))
        object_score_logits = self.pred_obj_score_head(hs[:, 0, :])
        return masks, iou_pred, mask_tokens_out, object_score_logits

    def _upscaled_masks(self, tokens: torch.Tensor, size: tuple[int, int], hyper_in: torch.Tensor,
                        high_res_features: list[torch.Tensor], image_index: torch.Tensor | None) -> torch.Tensor:
        """Masks (P, M, 4h, 4w) from the transformer's image tokens (P, h * w, C) by the path `upscale_impl`
        names; high_res_features [stride 4, stride 8] per image (image_index) or per prompt."""
        (b, _, c), (h, w) = tokens.shape, size
        src = tokens.view(b, h, w, c)  # channels-last
        feat_s0, feat_s1 = high_res_features
        if self.upscale_impl == "triton":  # the kernel reads each prompt's image's levels through image_index
            return kernels.upscaled_masks(src, self.output_upscaling, hyper_in, (feat_s1, feat_s0), image_index)
        if image_index is not None:
            feat_s0, feat_s1 = (feat.index_select(0, image_index) for feat in (feat_s0, feat_s1))
        if self.upscale_impl == "gemm":
            high_res = (feat_s1.permute(0, 2, 3, 1), feat_s0.permute(0, 2, 3, 1))  # channels-last views
            return kernels.upscaled_masks_reference(src, self.output_upscaling, hyper_in, high_res)
        dc1, ln1, act1, dc2, act2 = self.output_upscaling
        # sam2's NCHW view of the tokens, strides and all: a permute of the channels-last view differs in the
        # batch stride of a single prompt (1048576 vs 256), and with it the convolution's fp32 bits
        upscaled = act1(ln1(dc1(tokens.transpose(1, 2).view(b, c, h, w)) + feat_s1))
        upscaled = act2(dc2(upscaled) + feat_s0)
        b, c, h, w = upscaled.shape
        return (hyper_in @ upscaled.view(b, c, h * w)).view(b, -1, h, w)

    def output_token_weights(self) -> list[torch.Tensor]:
        """The object-score token first, then SAM 1's (sam2's order: hs[:, 0] is the object score's)."""
        return [self.obj_score_token.weight, *super().output_token_weights()]

    def _get_stability_scores(self, mask_logits: torch.Tensor) -> torch.Tensor:
        """IoU of the mask thresholded at +delta and at -delta."""
        mask_logits = mask_logits.flatten(-2)
        delta = self.dynamic_multimask_stability_delta
        area_i = torch.sum(mask_logits > delta, dim=-1).float()
        area_u = torch.sum(mask_logits > -delta, dim=-1).float()
        return torch.where(area_u > 0, area_i / area_u, 1.0)

    def _dynamic_multimask_via_stability(
        self, all_mask_logits: torch.Tensor, all_iou_scores: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The single-mask output where it is stable, else the multimask output with the highest IoU."""
        multimask_logits, multimask_iou = all_mask_logits[:, 1:], all_iou_scores[:, 1:]
        best = torch.argmax(multimask_iou, dim=-1)
        rows = torch.arange(multimask_iou.shape[0], device=all_iou_scores.device)
        best_logits = multimask_logits[rows, best].unsqueeze(1)
        best_iou = multimask_iou[rows, best].unsqueeze(1)

        single_logits, single_iou = all_mask_logits[:, 0:1], all_iou_scores[:, 0:1]
        is_stable = self._get_stability_scores(single_logits) >= self.dynamic_multimask_stability_thresh
        logits = torch.where(is_stable[..., None, None].expand_as(single_logits), single_logits, best_logits)
        iou = torch.where(is_stable.expand_as(single_iou), single_iou, best_iou)
        return logits, iou
