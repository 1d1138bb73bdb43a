"""Performer encoder-decoder (translation): fairseq's Transformer with FAVOR+ attention.

Registered model ``performer`` (a subclass of fairseq's legacy ``transformer`` model, same
command-line options plus ``--performer-*``) and architecture:

    performer_iwslt_de_en   the shape of transformer_iwslt_de_en (6+6 layers, d 512, 4 heads,
                            ffn 1024), like fourierformer_iwslt_de_en; its softmax twin is
                            stock ``transformer_iwslt_de_en`` (fourier_rf defaults: p = 2, R0 = 1.0).

Only the attention modules differ from the stock model (see ``attention_transformer``), so parameter
names match the twin's and, under one seed, every shared weight initialises identically (the random
features are drawn from generators of their own).
"""
from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import transformer_iwslt_de_en

from .attention_transformer import AttentionKindTransformerModel
from .performer_options import PerformerAttentionOptions, set_performer_defaults


@register_model("performer")
class PerformerModel(AttentionKindTransformerModel):
    """fairseq's Transformer (legacy argparse model) with FAVOR+ random-feature attention."""

    options_class = PerformerAttentionOptions


@register_model_architecture("performer", "performer_iwslt_de_en")
def performer_iwslt_de_en(args):
    set_performer_defaults(args, fourier_power=2, fourier_radius_init=1.0)
    transformer_iwslt_de_en(args)
