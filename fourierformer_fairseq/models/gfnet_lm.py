"""Global-filter language models: fairseq's ``transformer_lm`` with causal GFNet-style token mixing.

Registered model ``gfnet_lm`` (``transformer_lm``'s options plus ``--gfnet-*``) and the shapes of the
FourierFormer WikiText-103 models and their softmax twins:

    gfnet_lm_wiki103_small    16 layers, d 128, 8 heads, ffn 2048, context 256 (twin softmax_lm_wiki103_small)
    gfnet_lm_wiki103_medium   16 layers, d 256, 8 heads, ffn 2048, context 384 (twin softmax_lm_wiki103_medium)

Each layer's causal filter has one tap per position of the context (``--max-target-positions``,
set from the context, or ``--tokens-per-sample``). Train and evaluate with ``--tokens-per-sample``
at most the context. Incremental decoding keeps the values so far (O(t d) per step).
"""
from dataclasses import dataclass

from fairseq.models import register_model, register_model_architecture

from .lm_options import LanguageModelConfig
from .attention_transformer import AttentionKindLanguageModel, paper_lm_sizes
from .gfnet_options import GlobalFilterConfig, GlobalFilterOptions


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
