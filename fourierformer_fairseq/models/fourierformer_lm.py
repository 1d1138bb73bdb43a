"""FourierFormer language models: fairseq's ``transformer_lm`` with Fourier attention.

Registered model ``fourierformer_lm`` (``transformer_lm``'s options plus ``--fourier-*``) and
the paper's WikiText-103 models (Nguyen et al. 2022, after Schlag et al. 2021; not fairseq's
big ``transformer_lm_wiki103``):

    fourierformer_lm_wiki103_small    16 layers, d 128, 8 heads, ffn 2048, context 256, p = 4
    fourierformer_lm_wiki103_medium   16 layers, d 256, 8 heads, ffn 2048, context 384, p = 4

(radius init 2.0 with --fourier-paper-exact, as in the paper)

and their softmax twins at identical sizes, ``softmax_lm_wiki103_small`` / ``_medium`` (``softmax_lm.py``).

The context sets ``--max-target-positions``; train and evaluate with ``--tokens-per-sample``
equal to it (256 / 384). Adaptive input / softmax stay off unless asked for
(``--adaptive-input --adaptive-input-cutoff ... --adaptive-softmax-cutoff ... --tie-adaptive-weights``),
so the archs also run on small vocabularies.
"""

from dataclasses import dataclass

from fairseq.models import register_model, register_model_architecture
from fairseq.utils import safe_getattr

from .lm_options import LanguageModelConfig
from .attention_transformer import AttentionKindLanguageModel, paper_lm_sizes
from .fourier_attention_options import FourierAttentionConfig, FourierAttentionOptions, set_fourier_defaults


@dataclass
class FourierFormerLanguageModelConfig(LanguageModelConfig, FourierAttentionConfig):
    """``transformer_lm``'s options, ``lm_options``' and the --fourier-* ones (declared in FourierAttentionConfig)."""


@register_model("fourierformer_lm", dataclass=FourierFormerLanguageModelConfig)
class FourierFormerLanguageModel(AttentionKindLanguageModel):
    """fairseq's Transformer language model with Fourier integral self-attention."""

    options_class = FourierAttentionOptions

    @classmethod
    def build_model(cls, args, task):
        if safe_getattr(args, "fourier_power", None) is None:
            # --arch fourierformer_lm (the model's own name: dataclass defaults, no arch function);
            # a saved config always has the power, so old checkpoints keep their formulation
            set_fourier_defaults(args, power=LM_POWER, paper_radius_init=LM_PAPER_RADIUS_INIT)
        return super().build_model(args, task)


LM_POWER, LM_PAPER_RADIUS_INIT = 4, 2.0  # the paper's p and radius init for its language models


@register_model_architecture("fourierformer_lm", "fourierformer_lm_wiki103_small")
def fourierformer_lm_wiki103_small(args):
    set_fourier_defaults(args, power=LM_POWER, paper_radius_init=LM_PAPER_RADIUS_INIT)
    paper_lm_sizes(args, embed_dim=128, context=256)


@register_model_architecture("fourierformer_lm", "fourierformer_lm_wiki103_medium")
def fourierformer_lm_wiki103_medium(args):
    set_fourier_defaults(args, power=LM_POWER, paper_radius_init=LM_PAPER_RADIUS_INIT)
    paper_lm_sizes(args, embed_dim=256, context=384)
