"""Performer language models: fairseq's ``transformer_lm`` with FAVOR+ causal attention.

Registered model ``performer_lm`` (``transformer_lm``'s options plus ``--performer-*``) and the
shapes of the FourierFormer WikiText-103 models and their softmax twins:

    performer_lm_wiki103_small    16 layers, d 128, 8 heads, ffn 2048, context 256 (twin softmax_lm_wiki103_small)
    performer_lm_wiki103_medium   16 layers, d 256, 8 heads, ffn 2048, context 384 (twin softmax_lm_wiki103_medium)

Train and evaluate with ``--tokens-per-sample`` equal to the context. Incremental decoding keeps
a constant-size state per layer (see ``PerformerMultiheadAttention``).
"""
from dataclasses import dataclass

from omegaconf import II

from fairseq.models import register_model, register_model_architecture

from .lm_options import LanguageModelConfig
from .attention_transformer import AttentionKindLanguageModel, paper_lm_sizes
from .performer_options import PerformerAttentionOptions, PerformerConfig, set_performer_defaults


@dataclass
class PerformerLanguageModelConfig(LanguageModelConfig, PerformerConfig):
    """``transformer_lm``'s options, ``lm_options``' and the --performer-* ones (declared in PerformerConfig)."""

    seed: int = II("common.seed")  # the features' seed (no option of its own: --seed)


@register_model("performer_lm", dataclass=PerformerLanguageModelConfig)
class PerformerLanguageModel(AttentionKindLanguageModel):
    """fairseq's Transformer language model with FAVOR+ (random-feature) causal self-attention."""

    options_class = PerformerAttentionOptions


@register_model_architecture("performer_lm", "performer_lm_wiki103_small")
def performer_lm_wiki103_small(args):
    set_performer_defaults(args, fourier_power=4, fourier_radius_init=2.0)
    paper_lm_sizes(args, embed_dim=128, context=256)


@register_model_architecture("performer_lm", "performer_lm_wiki103_medium")
def performer_lm_wiki103_medium(args):
    set_performer_defaults(args, fourier_power=4, fourier_radius_init=2.0)
    paper_lm_sizes(args, embed_dim=256, context=384)
