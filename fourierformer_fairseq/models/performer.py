"""Performer: FAVOR+ attention's options, its translation model and its language models.

The ``--performer-*`` options, declared once: ``PerformerConfig`` (a fairseq dataclass; the
translation model adds it to its argparse options with ``gen_parser_from_dataclass``, the language
model's config inherits it). Architecture functions fill in what the command line left unset with
``set_performer_defaults``; ``PerformerAttentionOptions.from_args`` validates the options once
and ``build_attention`` makes the attention of one site (Performer if selected, fairseq's softmax
``MultiheadAttention`` otherwise). ``seed_performer_features`` gives every Performer attention of
a built model its own feature seed, a hash of ``--seed`` and the module's name, so that every
worker (and a model rebuilt to load a checkpoint) draws the same features.

Translation: registered model ``performer`` (a subclass of fairseq's legacy ``transformer`` model,
same command-line options plus ``--performer-*``) and architecture:

    performer_iwslt_de_en   the shape of transformer_iwslt_de_en (6+6 layers, d 512, 4 heads,
                            ffn 1024), like fourierformer_iwslt_de_en; its softmax twin is
                            stock ``transformer_iwslt_de_en`` (fourier_rf defaults: p = 2, R0 = 1.0).

Only the attention modules differ from the stock model (see ``attention_transformer``), so parameter
names match the twin's and, under one seed, every shared weight initialises identically (the random
features are drawn from generators of their own).

Language modelling: registered model ``performer_lm`` (``transformer_lm``'s options plus
``--performer-*``) and the shapes of the FourierFormer WikiText-103 models and their softmax twins:

    performer_lm_wiki103_small    16 layers, d 128, 8 heads, ffn 2048, context 256 (twin softmax_lm_wiki103_small)
    performer_lm_wiki103_medium   16 layers, d 256, 8 heads, ffn 2048, context 384 (twin softmax_lm_wiki103_medium)

Train and evaluate with ``--tokens-per-sample`` equal to the context. Incremental decoding keeps
a constant-size state per layer (see ``PerformerMultiheadAttention``).
"""

from dataclasses import dataclass, field

from omegaconf import II

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import transformer_iwslt_de_en
from fairseq.utils import safe_getattr

from fourierformer_fairseq.modules.performer_multihead_attention import PerformerMultiheadAttention
from fourierformer_fairseq.ops.favor import FEATURE_TYPES, KERNELS, feature_seed

from .attention_options import SITES, AttentionOptions, kwarg_field, site_choices
from .attention_transformer import AttentionKindLanguageModel, AttentionKindTransformerModel, paper_lm_sizes
from .fourier_kernel import FourierKernelConfig
from .lm_options import LanguageModelConfig


@dataclass
class PerformerConfig(FourierKernelConfig):
    """Every --performer-* option (and, shared with Fourier attention, the fourier_rf kernel's --fourier-*)."""

    performer_kernel: ChoiceEnum(KERNELS) = kwarg_field(
        "kernel", "softmax", "softmax: FAVOR+ positive random features of softmax attention; "
                             "relu: the generalised ReLU kernel; fourier_rf (experimental): random "
                             "features of the Fourier kernel prod_d sinc^p(R (q_d - k_d)), even p")
    performer_features: int = kwarg_field(
        "num_features", 0, "random features m per head; 0: round(d ln d) for softmax / relu (d the head "
                           "dim), 16 frequencies for fourier_rf (feature dimension m (2m + 1))")
    performer_redraw_interval: int = kwarg_field(
        "redraw_interval", 1000, "redraw the random features every N training updates "
                                 "(identically on every worker); 0: never")
    performer_feature_type: ChoiceEnum(FEATURE_TYPES) = kwarg_field(
        "feature_type", "orthogonal", "orthogonal (block-orthogonal rows, FAVOR+) or iid Gaussian rows")
    performer_attention: site_choices() = field(
        default="all", metadata={"help": "comma-separated attentions that are Performer, from encoder,decoder,cross "
                                         "in this order (or all / none); the others stay softmax"})


class PerformerAttentionOptions(AttentionOptions):
    """The --performer-* options of a model: ``sites`` and PerformerMultiheadAttention's keyword arguments."""

    config_class = PerformerConfig
    attention_class = PerformerMultiheadAttention
    sites_field = "performer_attention"
    parser_without_defaults = True

    @staticmethod
    def prepare_model(model, args) -> None:
        seed_performer_features(model, safe_getattr(args, "seed", 1))


def set_performer_defaults(args, **overrides) -> None:
    """For architecture functions: fill in every PerformerConfig field the command line left unset."""
    PerformerAttentionOptions.set_defaults(args, **overrides)


def seed_performer_features(model, seed: int) -> None:
    """Draw 0 of every Performer attention from a seed of its own: hash(seed, module name)."""
    for name, module in model.named_modules():
        if isinstance(module, PerformerMultiheadAttention):
            module.redraw_features(draw=0, seed=feature_seed(int(seed), name))


# ============================================================================ translation


@register_model("performer")
class PerformerModel(AttentionKindTransformerModel):
    """fairseq's Transformer (legacy argparse model) with FAVOR+ random-feature attention."""

    options_class = PerformerAttentionOptions


@register_model_architecture("performer", "performer_iwslt_de_en")
def performer_iwslt_de_en(args):
    set_performer_defaults(args, fourier_power=2, fourier_radius_init=1.0)
    transformer_iwslt_de_en(args)


# ============================================================================ language models


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


__all__ = [
    "PerformerAttentionOptions",
    "PerformerConfig",
    "PerformerLanguageModel",
    "PerformerLanguageModelConfig",
    "PerformerModel",
    "SITES",
    "seed_performer_features",
    "set_performer_defaults",
]
