"""FourierFormer encoder-decoder (translation): fairseq's Transformer with Fourier attention.

Registered model ``fourierformer`` (a subclass of fairseq's legacy ``transformer`` model,
same command-line options plus ``--fourier-*``) and architecture:

    fourierformer_iwslt_de_en   the shape of transformer_iwslt_de_en (6+6 layers, d 512, 4 heads,
                                ffn 1024) with the paper's p = 2 (radius init 1.0 with
                                --fourier-paper-exact); its softmax twin is stock
                                ``transformer_iwslt_de_en``.

Only the attention modules differ from the stock model (see ``attention_transformer``), so
parameter names match the twin's and, under one seed, every shared weight initialises identically.
"""
from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import transformer_iwslt_de_en

from .attention_transformer import AttentionKindTransformerModel
from .fourier_attention_options import FourierAttentionOptions, set_fourier_defaults


@register_model("fourierformer")
class FourierFormerModel(AttentionKindTransformerModel):
    """fairseq's Transformer (legacy argparse model) with Fourier integral attention."""

    options_class = FourierAttentionOptions


@register_model_architecture("fourierformer", "fourierformer_iwslt_de_en")
def fourierformer_iwslt_de_en(args):
    set_fourier_defaults(args, power=2, paper_radius_init=1.0)
    transformer_iwslt_de_en(args)
