"""The softmax twins of the language models: fairseq's ``transformer_lm`` with the plugin's LM options.

Registered model ``softmax_lm`` (``transformer_lm``'s options plus ``lm_options``': the published
model's LayerNorm placement, init and bias-free attention, for the twins as for every attention
kind) and the paper's shapes:

    softmax_lm_wiki103_small    16 layers, d 128, 8 heads, ffn 2048, context 256
    softmax_lm_wiki103_medium   16 layers, d 256, 8 heads, ffn 2048, context 384

Built as ``AttentionKindLanguageModel`` with no attention kind: every self-attention is fairseq's
``MultiheadAttention``, the modules, their names and their order are stock ``transformer_lm``'s, so
under one seed a twin initialises as stock ``transformer_lm`` and as the kind's model it is paired with.
"""
from dataclasses import dataclass

from fairseq.models import register_model, register_model_architecture

from .attention_options import SITES, AttentionOptions
from .attention_transformer import AttentionKindLanguageModel, paper_lm_sizes
from .lm_options import LanguageModelConfig


class SoftmaxOnlyOptions(AttentionOptions):
    """No attention kind: every site keeps fairseq's softmax ``MultiheadAttention``."""

    @classmethod
    def from_args(cls, args, available=SITES) -> "SoftmaxOnlyOptions":
        return cls(frozenset(), {})

    @classmethod
    def add_args(cls, parser) -> None:
        """Nothing to add: the model's options are its config's."""


@dataclass
class SoftmaxLanguageModelConfig(LanguageModelConfig):
    """``transformer_lm``'s options and ``lm_options``'."""


@register_model("softmax_lm", dataclass=SoftmaxLanguageModelConfig)
class SoftmaxLanguageModel(AttentionKindLanguageModel):
    """fairseq's Transformer language model, softmax attention everywhere."""

    options_class = SoftmaxOnlyOptions


@register_model_architecture("softmax_lm", "softmax_lm_wiki103_small")
def softmax_lm_wiki103_small(args):
    paper_lm_sizes(args, embed_dim=128, context=256)


@register_model_architecture("softmax_lm", "softmax_lm_wiki103_medium")
def softmax_lm_wiki103_medium(args):
    paper_lm_sizes(args, embed_dim=256, context=384)
