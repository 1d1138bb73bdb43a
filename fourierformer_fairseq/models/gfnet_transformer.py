"""Global-filter encoder-decoder (translation): fairseq's Transformer with GFNet-style token mixing.

Registered model ``gfnet`` (a subclass of fairseq's legacy ``transformer`` model, same command-line
options plus ``--gfnet-*``) and architecture:

    gfnet_iwslt_de_en   the shape of transformer_iwslt_de_en (6+6 layers, d 512, 4 heads, ffn 1024),
                        like fourierformer_iwslt_de_en; encoder and decoder self-attention are global
                        filters (the encoder's non-causal, the decoder's causal), encoder-decoder
                        attention stays softmax; its softmax twin is stock ``transformer_iwslt_de_en``.

Each filter has one tap per lag up to ``--max-source-positions`` / ``--max-target-positions``
(default 1024): 512 x 2047 parameters per encoder layer, 512 x 1024 per decoder layer, in place of
q_proj and k_proj.
"""
from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import transformer_iwslt_de_en

from .attention_transformer import AttentionKindTransformerModel
from .gfnet_options import GlobalFilterOptions


@register_model("gfnet")
class GlobalFilterModel(AttentionKindTransformerModel):
    """fairseq's Transformer (legacy argparse model) with global-filter self-attention."""

    options_class = GlobalFilterOptions


@register_model_architecture("gfnet", "gfnet_iwslt_de_en")
def gfnet_iwslt_de_en(args):
    GlobalFilterOptions.set_defaults(args)
    transformer_iwslt_de_en(args)
