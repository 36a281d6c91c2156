"""Builders of sam3 0.1.4's modules at small sizes and seeded weights, for the SAM 3 module tests."""

from __future__ import annotations

import torch
from torch import nn


def seed_detector_weights(module: nn.Module, seed: int) -> None:
    """Every parameter of a sam3 detector module drawn from a seeded generator, in place: matrices
    N(0, 1 / fan_in), vectors N(0, 0.1), LayerNorm weights 1 + N(0, 0.1). sam3 leaves some parameters
    torch.empty and zeroes others (biases, the box head's last layer); a zero would hide a dropped term."""
    generator = torch.Generator().manual_seed(seed)
    norms = {id(m.weight) for m in module.modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for param in module.parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() > 1:
                param.copy_(noise / param.shape[-1] ** 0.5)
            else:
                param.copy_(noise * 0.1 + (1.0 if id(param) in norms else 0.0))


def sam3_fusion_encoder(d_model: int, num_layers: int, num_heads: int, dim_feedforward: int):
    """sam3's TransformerEncoderFusion with model_builder._create_transformer_encoder's arguments but the sizes."""
    from sam3.model.encoder import TransformerEncoderFusion

    return TransformerEncoderFusion(
        layer=sam3_fusion_encoder_layer(d_model, num_heads, dim_feedforward),
        num_layers=num_layers,
        d_model=d_model,
        num_feature_levels=1,
        frozen=False,
        use_act_checkpoint=True,
        add_pooled_text_to_img_feat=False,
        pool_text_with_mask=True,
    ).eval()


def sam3_fusion_encoder_layer(
    d_model: int,
    num_heads: int,
    dim_feedforward: int,
    pos_enc_at_attn: bool = True,
    pos_enc_at_cross_attn_keys: bool = False,
    batch_first: bool = True,
):
    """sam3's TransformerEncoderLayer as the fusion encoder builds it (the defaults) or, with
    pos_enc_at_attn=False, pos_enc_at_cross_attn_keys=True, batch_first=False, as the geometry encoder does."""
    from sam3.model.encoder import TransformerEncoderLayer
    from sam3.model.model_misc import MultiheadAttentionWrapper

    def attention():
        return MultiheadAttentionWrapper(num_heads=num_heads, dropout=0.1, embed_dim=d_model, batch_first=batch_first)

    return TransformerEncoderLayer(
        activation="relu",
        d_model=d_model,
        dim_feedforward=dim_feedforward,
        dropout=0.1,
        pos_enc_at_attn=pos_enc_at_attn,
        pos_enc_at_cross_attn_keys=pos_enc_at_cross_attn_keys,
        pos_enc_at_cross_attn_queries=False,
        pre_norm=True,
        self_attention=attention(),
        cross_attention=attention(),
    ).eval()


def sam3_detr_decoder_layer(d_model: int, num_heads: int, dim_feedforward: int):
    """sam3's TransformerDecoderLayer with model_builder._create_transformer_decoder's arguments but the sizes."""
    from sam3.model.decoder import TransformerDecoderLayer
    from sam3.model.model_misc import MultiheadAttentionWrapper

    return TransformerDecoderLayer(
        activation="relu",
        d_model=d_model,
        dim_feedforward=dim_feedforward,
        dropout=0.1,
        cross_attention=MultiheadAttentionWrapper(num_heads=num_heads, dropout=0.1, embed_dim=d_model),
        n_heads=num_heads,
        use_text_cross_attention=True,
    ).eval()


def sam3_detr_decoder(d_model: int, num_layers: int, num_heads: int, dim_feedforward: int, num_queries: int):
    """sam3's TransformerDecoder with model_builder._create_transformer_decoder's arguments but the sizes, and
    resolution / stride None: with them sam3 precomputes its boxRPB coordinates with device="cuda" at
    build time; without, it computes the same coordinates from the feature size at the first forward."""
    from sam3.model.decoder import TransformerDecoder

    return TransformerDecoder(
        layer=sam3_detr_decoder_layer(d_model, num_heads, dim_feedforward),
        num_layers=num_layers,
        num_queries=num_queries,
        return_intermediate=True,
        box_refine=True,
        num_o2m_queries=0,
        dac=True,
        boxRPB="log",
        d_model=d_model,
        frozen=False,
        interaction_layer=None,
        dac_use_selfatt_ln=True,
        resolution=None,
        stride=None,
        use_act_checkpoint=True,
        presence_token=True,
    ).eval()


def sam3_dot_product_scoring(d_model: int, mlp_dim: int):
    """sam3's DotProductScoring with model_builder._create_dot_product_scoring's arguments but the sizes."""
    from sam3.model.model_misc import MLP, DotProductScoring

    prompt_mlp = MLP(
        input_dim=d_model,
        hidden_dim=mlp_dim,
        output_dim=d_model,
        num_layers=2,
        dropout=0.1,
        residual=True,
        out_norm=nn.LayerNorm(d_model),
    )
    return DotProductScoring(d_model=d_model, d_proj=d_model, prompt_mlp=prompt_mlp).eval()


def sam3_image_model(config):
    """sam3's Sam3Image as sam3.model_builder.build_sam3_image_model assembles it (no instance
    interactivity, eval mode), every module at the sizes of `config` (a samfast.sam3.config.Sam3Config).
    The position encodings and the decoder are built without a precompute resolution: with one, sam3
    fills their caches on device="cuda" at build time; without, it computes the same values at the
    first forward."""
    from sam3.model.encoder import TransformerEncoderLayer
    from sam3.model.geometry_encoders import SequenceGeometryEncoder
    from sam3.model.maskformer_segmentation import PixelDecoder, UniversalSegmentationHead
    from sam3.model.model_misc import MultiheadAttentionWrapper, TransformerWrapper
    from sam3.model.necks import Sam3DualViTDetNeck
    from sam3.model.position_encoding import PositionEmbeddingSine
    from sam3.model.sam3_image import Sam3Image
    from sam3.model.text_encoder_ve import VETextEncoder
    from sam3.model.tokenizer_ve import SimpleTokenizer
    from sam3.model.vitdet import ViT
    from sam3.model.vl_combiner import SAM3VLBackbone

    from samfast.sam3.tokenizer import bpe_vocab_path

    c = config
    d_model = c.d_model

    def position_encoding():
        return PositionEmbeddingSine(num_pos_feats=d_model, normalize=True, scale=None, temperature=10000)

    vit = ViT(
        img_size=c.image_size, pretrain_img_size=c.pretrain_image_size, patch_size=c.patch_size,
        embed_dim=c.vit_embed_dim, depth=c.vit_depth, num_heads=c.vit_num_heads, mlp_ratio=c.vit_mlp_ratio,
        norm_layer="LayerNorm", drop_path_rate=0.1, qkv_bias=True, use_abs_pos=True, tile_abs_pos=True,
        global_att_blocks=c.vit_global_blocks, rel_pos_blocks=(), use_rope=True, use_interp_rope=True,
        window_size=c.vit_window_size, pretrain_use_cls_token=True, retain_cls_token=False, ln_pre=True,
        ln_post=False, return_interm_layers=False, bias_patch_embed=False,
    )
    neck = Sam3DualViTDetNeck(position_encoding=position_encoding(), d_model=d_model,
                              scale_factors=list(c.neck_scale_factors), trunk=vit, add_sam2_neck=c.add_sam2_neck)
    text = VETextEncoder(tokenizer=SimpleTokenizer(bpe_path=str(bpe_vocab_path())), d_model=d_model,
                         width=c.text_width, heads=c.text_heads, layers=c.text_layers)
    transformer = TransformerWrapper(
        encoder=sam3_fusion_encoder(d_model, c.encoder_layers, c.num_heads, c.dim_feedforward),
        decoder=sam3_detr_decoder(d_model, c.decoder_layers, c.num_heads, c.dim_feedforward, c.num_queries),
        d_model=d_model,
    )
    geometry_layer = sam3_fusion_encoder_layer(d_model, c.num_heads, c.dim_feedforward, pos_enc_at_attn=False,
                                               pos_enc_at_cross_attn_keys=True, batch_first=False)
    geometry_encoder = SequenceGeometryEncoder(
        pos_enc=position_encoding(), encode_boxes_as_points=False, points_direct_project=True, points_pool=True,
        points_pos_enc=True, boxes_direct_project=True, boxes_pool=True, boxes_pos_enc=True, d_model=d_model,
        num_layers=c.geometry_layers, layer=geometry_layer, use_act_ckpt=True, add_cls=True,
        add_post_encode_proj=True,
    )
    segmentation_head = UniversalSegmentationHead(
        hidden_dim=d_model, upsampling_stages=c.mask_upsampling_stages, aux_masks=False, presence_head=False,
        dot_product_scorer=None, act_ckpt=True,
        cross_attend_prompt=MultiheadAttentionWrapper(num_heads=c.num_heads, dropout=0, embed_dim=d_model),
        pixel_decoder=PixelDecoder(num_upsampling_stages=c.mask_upsampling_stages, interpolation_mode="nearest",
                                   hidden_dim=d_model),
    )
    return Sam3Image(
        backbone=SAM3VLBackbone(visual=neck, text=text, scalp=c.scalp),
        transformer=transformer,
        input_geometry_encoder=geometry_encoder,
        segmentation_head=segmentation_head,
        num_feature_levels=1,
        o2m_mask_predict=True,
        dot_prod_scoring=sam3_dot_product_scoring(d_model, c.scoring_mlp_dim),
        use_instance_query=False,
        multimask_output=True,
        inst_interactive_predictor=None,
        matcher=None,
    ).eval()


def seed_image_model_weights(model: nn.Module, seed: int) -> None:
    """Every parameter of a sam3 image model drawn from a seeded generator, in place: weights of two
    or more dimensions N(0, 1 / fan_in) (fan_in: all but the first dimension, so that convolutions keep
    their activations' scale through the trunk and the neck), vectors N(0, 0.1), LayerNorm and GroupNorm
    weights 1 + N(0, 0.1). It covers the tensors sam3 leaves torch.empty (the text encoder's positional
    table and projection) and the ones it zeroes."""
    generator = torch.Generator().manual_seed(seed)
    norms = {id(m.weight) for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.GroupNorm))}
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() > 1:
                param.copy_(noise / param[0].numel() ** 0.5)
            else:
                param.copy_(noise * 0.1 + (1.0 if id(param) in norms else 0.0))



def sam3_interactive_predictor(config) -> nn.Module:
    """sam3's SAM3InteractiveImagePredictor (model/sam1_task_predictor.py) over the tracker parts its
    predict_inst uses, built as Sam3TrackerBase._build_sam_heads builds them but at `config`'s width and
    image size: sam3's tracker is built at 1008 px and width 256 whatever the image model's sizes, so
    the heads stand in a small module with the tracker's attributes (its _prepare_backbone_features
    itself), and the predictor's hard-coded feature sizes are set to this model's."""
    from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor
    from sam3.model.sam3_tracker_base import Sam3TrackerBase
    from sam3.sam.mask_decoder import MaskDecoder
    from sam3.sam.prompt_encoder import PromptEncoder
    from sam3.sam.transformer import TwoWayTransformer

    d_model, grid = config.d_model, config.grid_size

    class TrackerHeads(nn.Module):
        num_feature_levels = 3
        _prepare_backbone_features = Sam3TrackerBase._prepare_backbone_features

        def __init__(self):
            super().__init__()
            self.image_size = config.image_size
            self.sam_prompt_encoder = PromptEncoder(embed_dim=d_model, image_embedding_size=(grid, grid),
                                                    input_image_size=(config.image_size, config.image_size),
                                                    mask_in_chans=16)
            self.sam_mask_decoder = MaskDecoder(
                num_multimask_outputs=3,
                transformer=TwoWayTransformer(depth=2, embedding_dim=d_model, mlp_dim=8 * d_model, num_heads=8),
                transformer_dim=d_model, iou_head_depth=3, iou_head_hidden_dim=d_model, use_high_res_features=True,
                iou_prediction_use_sigmoid=True, pred_obj_scores=True, pred_obj_scores_mlp=True,
                use_multimask_token_for_obj_ptr=True, dynamic_multimask_via_stability=True,
                dynamic_multimask_stability_delta=0.05, dynamic_multimask_stability_thresh=0.98,
            )
            self.no_mem_embed = nn.Parameter(torch.zeros(1, 1, d_model))

        @property
        def device(self) -> torch.device:
            return self.no_mem_embed.device

    predictor = SAM3InteractiveImagePredictor(TrackerHeads())
    predictor._bb_feat_sizes = [(4 * grid, 4 * grid), (2 * grid, 2 * grid), (grid, grid)]
    return predictor
