"""FourierFormer: Fourier integral attention's options, its translation model and its language models.

The ``--fourier-*`` options, declared once: ``FourierAttentionConfig`` (a fairseq dataclass; the
translation model adds it to its argparse options with ``gen_parser_from_dataclass``, the language
model's config inherits it). Architecture functions fill in their defaults with
``set_fourier_defaults``; ``FourierAttentionOptions.from_args`` validates them once, with clear
errors, and ``build_attention`` makes the attention of one site: Fourier if the site is selected,
fairseq's softmax ``MultiheadAttention`` otherwise.

Defaults (why: docs/training-dynamics.md): queries and keys normalised to unit RMS per head
(``--fourier-qk-norm rms``) and the radius started at ``sqrt(3 / (p sqrt(head_dim)))``, where
the kernel is as peaked as softmax attention at initialisation; ``--fourier-paper-exact`` selects
the paper's formulation instead (no normalisation, the paper's radius init: 1.0 for translation,
2.0 for the language models; exact normalisation over the keys, without the published code's
``+ 1e-6``).

Translation: registered model ``fourierformer`` (a subclass of fairseq's legacy ``transformer``
model, same command-line options plus ``--fourier-*``) and architecture:

    fourierformer_iwslt_de_en   the shape of transformer_iwslt_de_en (6+6 layers, d 512, 4 heads,
                                ffn 1024) with the paper's p = 2 (radius init 1.0 with
                                --fourier-paper-exact); its softmax twin is stock
                                ``transformer_iwslt_de_en``.

Only the attention modules differ from the stock model (see ``attention_transformer``), so
parameter names match the twin's and, under one seed, every shared weight initialises identically.

Language modelling: registered model ``fourierformer_lm`` (``transformer_lm``'s options plus
``--fourier-*``) and the paper's WikiText-103 models (Nguyen et al. 2022, after Schlag et al. 2021;
not fairseq's big ``transformer_lm_wiki103``):

    fourierformer_lm_wiki103_small    16 layers, d 128, 8 heads, ffn 2048, context 256, p = 4
    fourierformer_lm_wiki103_medium   16 layers, d 256, 8 heads, ffn 2048, context 384, p = 4

(radius init 2.0 with --fourier-paper-exact, as in the paper)

and their softmax twins at identical sizes, ``softmax_lm_wiki103_small`` / ``_medium`` (``softmax_lm.py``).

The context sets ``--max-target-positions``; train and evaluate with ``--tokens-per-sample``
equal to it (256 / 384). Adaptive input / softmax stay off unless asked for
(``--adaptive-input --adaptive-input-cutoff ... --adaptive-softmax-cutoff ... --tie-adaptive-weights``),
so the archs also run on small vocabularies.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_legacy import transformer_iwslt_de_en
from fairseq.utils import safe_getattr

from fourierformer_fairseq.modules.fourier_multihead_attention import KERNELS, QK_NORMS, FourierMultiheadAttention
from fourierformer_fairseq.ops.inputs import PHIS

from .attention_options import SITES, AttentionOptions, kwarg_field, parse_sites, site_choices, site_tag
from .attention_transformer import AttentionKindLanguageModel, AttentionKindTransformerModel, paper_lm_sizes
from .fourier_kernel import FourierKernelConfig
from .lm_options import LanguageModelConfig


@dataclass
class FourierAttentionConfig(FourierKernelConfig):
    """Every --fourier-* option. ``None`` means: the architecture's default (see set_fourier_defaults)."""

    fourier_phi: ChoiceEnum(PHIS) = kwarg_field(
        "phi", "power", "phi applied to sinc: power (x^p, the paper's), abs, relu or sigmoid")
    fourier_qk_norm: Optional[ChoiceEnum(QK_NORMS)] = kwarg_field(
        "qk_norm", None, "rms: divide q and k by their RMS over the head dim before scoring "
                         "(default); none: the paper's (default with --fourier-paper-exact)")
    fourier_kernel: ChoiceEnum(KERNELS) = kwarg_field(
        "kernel", "sinc", "sinc: Fourier integral attention; gaussian: the ablation "
                          "exp(-(p R^2 / 6) |q - k|^2), sinc's small-argument limit")
    fourier_paper_exact: bool = field(
        default=False, metadata={"help": "the paper's formulation: no q/k normalisation, the paper's radius init "
                                         "(exact normalisation over keys, without the published code's + 1e-6)"})
    fourier_normaliser_eps: Optional[float] = kwarg_field(
        "normaliser_eps", None, "out_i = sum_j w_ij v_j / (sum_j w_ij + EPS), the published code's normaliser: a "
                                "null key of log-weight log(EPS) and value 0; default 0 (exact), 1e-6 with "
                                "--fourier-published")
    fourier_proj_init_std: Optional[float] = kwarg_field(
        "proj_init_std", None, "initialise the Fourier attentions' q, k, v and output projections N(0, STD); "
                               "default: fairseq's init, 0.02 with --fourier-published")
    fourier_proj_bias: Optional[bool] = kwarg_field(
        "bias", None, "keep the biases of the Fourier attentions' projections (the default, except with "
                      "--fourier-published)")
    fourier_published: bool = field(
        default=False, metadata={"help": "the published code's attention: --fourier-paper-exact with its + 1e-6 "
                                         "normaliser and its projections' init (each can be overridden; where it "
                                         "trains and where not: docs/published-model.md)"})
    fourier_attention: site_choices() = field(
        default="all", metadata={"help": "comma-separated attentions that are Fourier, from encoder,decoder,cross "
                                         "in this order (or all / none); the others stay softmax"})
    fourier_log_interval: int = kwarg_field(
        "log_interval", 0, "every N updates, log each Fourier layer's radius (radius_<layer>) and the mean "
                           "attention entropy per site (entropy_<site>, nats) through fairseq's metrics; 0: off")


# What --fourier-published sets beyond --fourier-paper-exact: the published code's normaliser
# (sum_j w_ij + 1e-6) and the init of its attention projections (nn.Linear(bias=False), weights
# N(0, 0.02)); docs/published-model.md lists every difference and what is not reproduced.
PUBLISHED_ATTENTION = {"fourier_normaliser_eps": 1e-6, "fourier_proj_init_std": 0.02, "fourier_proj_bias": False}


class FourierAttentionOptions(AttentionOptions):
    """The --fourier-* options of a model: ``sites`` and FourierMultiheadAttention's keyword arguments."""

    config_class = FourierAttentionConfig
    attention_class = FourierMultiheadAttention
    sites_field = "fourier_attention"

    @classmethod
    def read_kwargs(cls, args) -> Dict[str, Any]:
        if safe_getattr(args, "fourier_power", None) is None:
            raise ValueError("--fourier-power is not set; use a FourierFormer --arch (it sets the defaults)")
        kwargs = super().read_kwargs(args)
        # The arch functions always set it; it is missing only from the saved options of checkpoints
        # trained before it existed, which used the paper's formulation and must be rebuilt that way.
        kwargs.setdefault("qk_norm", "none")
        return kwargs

    @staticmethod
    def prepare_model(model, args) -> None:
        name_fourier_layers(model)


def set_fourier_defaults(args, *, power: int, paper_radius_init: float) -> None:
    """For architecture functions: fill in what the command line left unset.

    power: the arch's p. paper_radius_init: the paper's initial radius for this arch, used with
    --fourier-paper-exact (otherwise the radius starts at auto_radius unless given).
    """
    published = bool(safe_getattr(args, "fourier_published", False))
    paper = published or bool(safe_getattr(args, "fourier_paper_exact", False))
    if published:  # the published code's attention (docs/published-model.md), where the command line is silent
        for name, value in PUBLISHED_ATTENTION.items():
            if safe_getattr(args, name, None) is None:
                setattr(args, name, value)
    if safe_getattr(args, "fourier_power", None) is None:
        args.fourier_power = power
    if safe_getattr(args, "fourier_qk_norm", None) is None:
        args.fourier_qk_norm = "none" if paper else "rms"
    if paper and safe_getattr(args, "fourier_radius_init", None) is None:
        args.fourier_radius_init = paper_radius_init
    FourierAttentionOptions.set_defaults(args)  # the rest: as FourierAttentionConfig declares them


def name_fourier_layers(model) -> None:
    """Sets each Fourier attention's ``log_name`` from its place: enc<i>, dec<i> (self), cross<i>."""
    for name, module in model.named_modules():
        if not isinstance(module, FourierMultiheadAttention):
            continue
        index = next((p for p in reversed(name.split(".")) if p.isdigit()), "")
        module.log_name = f"{site_tag(name)}{index}"


# ============================================================================ translation


@register_model("fourierformer")
class FourierFormerModel(AttentionKindTransformerModel):
    """fairseq's Transformer (legacy argparse model) with Fourier integral attention."""

    options_class = FourierAttentionOptions


@register_model_architecture("fourierformer", "fourierformer_iwslt_de_en")
def fourierformer_iwslt_de_en(args):
    set_fourier_defaults(args, power=2, paper_radius_init=1.0)
    transformer_iwslt_de_en(args)


# ============================================================================ language models

LM_POWER, LM_PAPER_RADIUS_INIT = 4, 2.0  # the paper's p and radius init for its language models


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


@register_model_architecture("fourierformer_lm", "fourierformer_lm_wiki103_small")
def fourierformer_lm_wiki103_small(args):
    set_fourier_defaults(args, power=LM_POWER, paper_radius_init=LM_PAPER_RADIUS_INIT)
    paper_lm_sizes(args, embed_dim=128, context=256)


@register_model_architecture("fourierformer_lm", "fourierformer_lm_wiki103_medium")
def fourierformer_lm_wiki103_medium(args):
    set_fourier_defaults(args, power=LM_POWER, paper_radius_init=LM_PAPER_RADIUS_INIT)
    paper_lm_sizes(args, embed_dim=256, context=384)


__all__ = [
    "FourierAttentionConfig",
    "FourierAttentionOptions",
    "FourierFormerLanguageModel",
    "FourierFormerLanguageModelConfig",
    "FourierFormerModel",
    "name_fourier_layers",
    "SITES",
    "parse_sites",
    "set_fourier_defaults",
]
