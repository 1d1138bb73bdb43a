"""Global filter (GFNet-style token mixing): its options, its translation model and its language models.

The ``--gfnet-*`` options, declared once: ``GlobalFilterConfig`` (a fairseq dataclass; the
translation model adds it to its argparse options, the language model's config inherits it);
``GlobalFilterOptions`` reads, validates (``GlobalFilterMixer.check_options``) and passes them (see
``attention_options``). The filter replaces self-attention only: ``--gfnet-attention`` selects
among encoder and decoder, and encoder-decoder attention stays softmax.

Translation: registered model ``gfnet`` (a subclass of fairseq's legacy ``transformer`` model, same
command-line options plus ``--gfnet-*``) and architecture:

    gfnet_iwslt_de_en   the shape of transformer_iwslt_de_en (6+6 layers, d 512, 4 heads, ffn 1024),
                        like fourierformer_iwslt_de_en; encoder and decoder self-attention are global
                        filters (the encoder's non-causal, the decoder's causal), encoder-decoder
                        attention stays softmax; its softmax twin is stock ``transformer_iwslt_de_en``.

Each filter has one tap per lag up to ``--max-source-positions`` / ``--max-target-positions``
(default 1024): 512 x 2047 parameters per encoder layer, 512 x 1024 per decoder layer, in place of
q_proj and k_proj.

Language modelling: registered model ``gfnet_lm`` (``transformer_lm``'s options plus ``--gfnet-*``)
and the shapes of the FourierFormer WikiText-103 models and their softmax twins:

    gfnet_lm_wiki103_small    16 layers, d 128, 8 heads, ffn 2048, context 256 (twin softmax_lm_wiki103_small)
    gfnet_lm_wiki103_medium   16 layers, d 256, 8 heads, ffn 2048, context 384 (twin softmax_lm_wiki103_medium)

Each layer's causal filter has one tap per position of the context (``--max-target-positions``,
set from the context, or ``--tokens-per-sample``). Train and evaluate with ``--tokens-per-sample``
at most the context. Incremental decoding keeps the values so far (O(t d) per step).
"""
from dataclasses import dataclass, field

from fairseq.dataclass import FairseqDataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import transformer_iwslt_de_en

from fourierformer_fairseq.modules.global_filter_mixer import GlobalFilterMixer

from .attention_options import AttentionOptions, kwarg_field, site_choices
from .attention_transformer import AttentionKindLanguageModel, AttentionKindTransformerModel, paper_lm_sizes
from .lm_options import LanguageModelConfig


@dataclass
class GlobalFilterConfig(FairseqDataclass):
    """Every --gfnet-* option."""

    gfnet_init_std: float = kwarg_field(
        "init_std", 0.02, "standard deviation of the global filter's initial time-domain taps (GFNet's 0.02)")
    gfnet_attention: site_choices() = field(
        default="all", metadata={"help": "comma-separated self-attentions replaced by the global filter, from "
                                         "encoder,decoder in this order (or all / none); the others, and "
                                         "encoder-decoder attention, stay softmax"})


class GlobalFilterOptions(AttentionOptions):
    """The --gfnet-* options of a model: ``sites`` and GlobalFilterMixer's keyword arguments."""

    config_class = GlobalFilterConfig
    attention_class = GlobalFilterMixer
    sites_field = "gfnet_attention"
    supported_sites = ("encoder", "decoder")


# ============================================================================ translation


@register_model("gfnet")
class GlobalFilterModel(AttentionKindTransformerModel):
    """fairseq's Transformer (legacy argparse model) with global-filter self-attention."""

    options_class = GlobalFilterOptions


@register_model_architecture("gfnet", "gfnet_iwslt_de_en")
def gfnet_iwslt_de_en(args):
    GlobalFilterOptions.set_defaults(args)
    transformer_iwslt_de_en(args)


# ============================================================================ language models


@dataclass
class GlobalFilterLanguageModelConfig(LanguageModelConfig, GlobalFilterConfig):
    """``transformer_lm``'s options, ``lm_options``' and the --gfnet-* ones (declared in GlobalFilterConfig)."""


@register_model("gfnet_lm", dataclass=GlobalFilterLanguageModelConfig)
class GlobalFilterLanguageModel(AttentionKindLanguageModel):
    """fairseq's Transformer language model with causal global-filter token mixing."""

    options_class = GlobalFilterOptions


@register_model_architecture("gfnet_lm", "gfnet_lm_wiki103_small")
def gfnet_lm_wiki103_small(args):
    GlobalFilterOptions.set_defaults(args)
    paper_lm_sizes(args, embed_dim=128, context=256)


@register_model_architecture("gfnet_lm", "gfnet_lm_wiki103_medium")
def gfnet_lm_wiki103_medium(args):
    GlobalFilterOptions.set_defaults(args)
    paper_lm_sizes(args, embed_dim=256, context=384)


__all__ = [
    "GlobalFilterConfig",
    "GlobalFilterLanguageModel",
    "GlobalFilterLanguageModelConfig",
    "GlobalFilterModel",
    "GlobalFilterOptions",
]
