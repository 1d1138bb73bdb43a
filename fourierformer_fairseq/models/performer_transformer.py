"""Performer encoder-decoder (translation): fairseq's Transformer with FAVOR+ attention.

Registered model ``performer`` (a subclass of fairseq's legacy ``transformer`` model, same
command-line options plus ``--performer-*``) and architecture:

    performer_iwslt_de_en   the shape of transformer_iwslt_de_en (6+6 layers, d 512, 4 heads,
                            ffn 1024), like fourierformer_iwslt_de_en; its softmax twin is
                            stock ``transformer_iwslt_de_en`` (fourier_rf defaults: p = 2, R0 = 1.0).

Only the attention modules differ from the stock model: the layers below override
``build_self_attention`` / ``build_encoder_attention`` and nothing else, so parameter names match
the twin's and, under one seed, every shared weight initialises identically (the random features
are drawn from generators of their own).
"""
from __future__ import annotations

from typing import Dict, List, Optional

from torch import Tensor

from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerEncoderBase
from fairseq.models.transformer.transformer_legacy import TransformerModel, transformer_iwslt_de_en
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from fairseq.utils import safe_getattr

from .performer_options import (
    SITES,
    PerformerAttentionOptions,
    add_performer_args,
    seed_performer_features,
    set_performer_defaults,
)

NO_ALIGNMENT_LAYER = -1  # an alignment_layer index that matches no layer: no weights are requested


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's build_{en,de}coder_layer do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class PerformerTransformerEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer; self-attention from ``performer`` (Performer if "encoder" is selected)."""

    def __init__(self, cfg, performer: PerformerAttentionOptions, return_fc=False):
        self.performer = performer  # read by build_self_attention during super().__init__
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return self.performer.build_attention(
            "encoder",
            embed_dim,
            cfg.encoder.attention_heads,
            dropout=cfg.attention_dropout,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class PerformerTransformerDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer; self-attention ("decoder") and encoder attention ("cross") from ``performer``."""

    def __init__(self, cfg, performer: PerformerAttentionOptions, no_encoder_attn=False, add_bias_kv=False,
                 add_zero_attn=False):
        self.performer = performer
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return self.performer.build_attention(
            "decoder",
            embed_dim,
            cfg.decoder.attention_heads,
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=not cfg.cross_self_attention,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return self.performer.build_attention(
            "cross",
            embed_dim,
            cfg.decoder.attention_heads,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class PerformerTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, performer: PerformerAttentionOptions, return_fc=False):
        self.performer = performer
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg):
        return wrap_layer(PerformerTransformerEncoderLayer(cfg, self.performer, return_fc=self.return_fc), cfg)


class PerformerTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder with Performer layers.

    In training mode the encoder attention's weights (``extra["attn"]``, which ordinary criteria
    discard) are computed only when the caller names an ``alignment_layer``: random-feature
    attention has to materialise them. In eval mode they are returned as stock.
    """

    def __init__(self, cfg, dictionary, embed_tokens, performer: PerformerAttentionOptions, no_encoder_attn=False,
                 output_projection=None):
        self.performer = performer
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(PerformerTransformerDecoderLayer(cfg, self.performer, no_encoder_attn), cfg)

    def extract_features(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        if self.training and alignment_layer is None and "cross" in self.performer.sites:
            alignment_layer = NO_ALIGNMENT_LAYER
        return super().extract_features(
            prev_output_tokens,
            encoder_out,
            incremental_state=incremental_state,
            full_context_alignment=full_context_alignment,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
        )


@register_model("performer")
class PerformerModel(TransformerModel):
    """fairseq's Transformer (legacy argparse model) with FAVOR+ random-feature attention."""

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_performer_args(parser)

    @classmethod
    def build_model(cls, args, task):
        PerformerAttentionOptions.from_args(args, SITES)  # fail early, with the flag names, on bad options
        model = super().build_model(args, task)
        seed_performer_features(model, safe_getattr(args, "seed", 1))
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        performer = PerformerAttentionOptions.from_args(args, SITES)
        return PerformerTransformerEncoder(cfg, src_dict, embed_tokens, performer)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return PerformerTransformerDecoder(
            cfg, tgt_dict, embed_tokens, PerformerAttentionOptions.from_args(args, SITES),
            no_encoder_attn=cfg.no_cross_attention,
        )


@register_model_architecture("performer", "performer_iwslt_de_en")
def performer_iwslt_de_en(args):
    set_performer_defaults(args, fourier_power=2, fourier_radius_init=1.0)
    transformer_iwslt_de_en(args)
