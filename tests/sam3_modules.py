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
