"""The ``--performer-*`` options of the Performer architectures, declared once.

``PerformerConfig`` is the one declaration (a fairseq dataclass): the translation model adds it
to its argparse options with ``gen_parser_from_dataclass``, the language model's config inherits
it. Architecture functions fill in what the command line left unset with
``set_performer_defaults``; ``PerformerAttentionOptions.from_args`` validates the options once
and ``build_attention`` makes the attention of one site (Performer if selected, fairseq's softmax
``MultiheadAttention`` otherwise). ``seed_performer_features`` gives every Performer attention of
a built model its own feature seed, a hash of ``--seed`` and the module's name, so that every
worker (and a model rebuilt to load a checkpoint) draws the same features.
"""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum
from fairseq.utils import safe_getattr

from fourierformer_fairseq.modules.performer_multihead_attention import PerformerMultiheadAttention
from fourierformer_fairseq.ops.favor import FEATURE_TYPES, KERNELS, feature_seed

from .attention_options import SITES, AttentionOptions, kwarg_field, site_choices
from .kernel_options import FourierKernelConfig


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


__all__ = [
    "PerformerAttentionOptions",
    "PerformerConfig",
    "SITES",
    "seed_performer_features",
    "set_performer_defaults",
]
