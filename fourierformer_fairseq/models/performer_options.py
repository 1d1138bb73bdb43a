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

from dataclasses import dataclass, field, fields
from typing import FrozenSet, Sequence

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.utils import safe_getattr

from fourierformer_fairseq.modules.fourier_multihead_attention import RADIUS_SHAPES
from fourierformer_fairseq.modules.performer_multihead_attention import PerformerMultiheadAttention
from fourierformer_fairseq.ops.favor import FEATURE_TYPES, KERNELS, feature_seed

from .attention_options import SITES, AttentionOptions, parse_sites


@dataclass
class PerformerConfig(FairseqDataclass):
    """Every --performer-* option (and fourier_rf's --fourier-*)."""

    performer_kernel: ChoiceEnum(KERNELS) = field(
        default="softmax", metadata={"help": "softmax: FAVOR+ positive random features of softmax attention; "
                                             "relu: the generalised ReLU kernel; fourier_rf (experimental): random "
                                             "features of the Fourier kernel prod_d sinc^p(R (q_d - k_d)), even p"})
    performer_features: int = field(
        default=0, metadata={"help": "random features m per head; 0: round(d ln d) for softmax / relu (d the head "
                                     "dim), 16 frequencies for fourier_rf (feature dimension m (2m + 1))"})
    performer_redraw_interval: int = field(
        default=1000, metadata={"help": "redraw the random features every N training updates "
                                        "(identically on every worker); 0: never"})
    performer_feature_type: ChoiceEnum(FEATURE_TYPES) = field(
        default="orthogonal", metadata={"help": "orthogonal (block-orthogonal rows, FAVOR+) or iid Gaussian rows"})
    performer_attention: str = field(
        default="all", metadata={"help": "comma-separated attentions that are Performer, from encoder,decoder,cross "
                                         "(or all / none); the others stay softmax"})
    fourier_power: int = field(
        default=4, metadata={"help": "fourier_rf: p of the kernel prod_d sinc^p(R (q_d - k_d)) (even)"})
    fourier_radius_init: float = field(
        default=2.0, metadata={"help": "fourier_rf: initial value of the learnable radius R"})
    fourier_radius_shape: ChoiceEnum(RADIUS_SHAPES) = field(
        default="scalar",
        metadata={"help": "fourier_rf: one radius per layer (scalar), per head, or per head and feature"})


def add_performer_args(parser) -> None:
    """Adds the --performer-* options to a legacy (argparse) model's parser (no defaults: the arch sets them)."""
    gen_parser_from_dataclass(parser, PerformerConfig(), delete_default=True)


def set_performer_defaults(args, **overrides) -> None:
    """For architecture functions: fill in every PerformerConfig field the command line left unset."""
    for f in fields(PerformerConfig):
        if f.name.startswith("_"):
            continue
        default = overrides.get(f.name, f.default)
        current = safe_getattr(args, f.name, None)
        setattr(args, f.name, default if current is None else current)


@dataclass(frozen=True)
class PerformerAttentionOptions(AttentionOptions):
    sites: FrozenSet[str]
    kernel: str
    num_features: int
    redraw_interval: int
    feature_type: str
    power: int
    radius_init: float
    radius_shape: str

    @classmethod
    def from_args(cls, args, available: Sequence[str] = SITES) -> "PerformerAttentionOptions":
        """Reads and validates the performer options of a fairseq args namespace / config."""
        get = {f.name: safe_getattr(args, f.name, f.default) for f in fields(PerformerConfig)}
        kernel = str(get["performer_kernel"])
        if kernel not in KERNELS:
            raise ValueError(f"--performer-kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        feature_type = str(get["performer_feature_type"])
        if feature_type not in FEATURE_TYPES:
            raise ValueError(
                f"--performer-feature-type must be one of {', '.join(FEATURE_TYPES)}, got {feature_type!r}")
        for flag, key in (("--performer-features", "performer_features"),
                          ("--performer-redraw-interval", "performer_redraw_interval")):
            value = get[key]
            if isinstance(value, bool) or int(value) != value or int(value) < 0:
                raise ValueError(f"{flag} must be a non-negative integer, got {value!r}")
        power = get["fourier_power"]
        if kernel == "fourier_rf" and (int(power) != power or power < 2 or power % 2):
            raise ValueError(f"--performer-kernel fourier_rf needs an even --fourier-power >= 2, got {power!r}")
        if not float(get["fourier_radius_init"]) > 0:
            raise ValueError(f"--fourier-radius-init must be positive, got {get['fourier_radius_init']!r}")
        radius_shape = str(get["fourier_radius_shape"])
        if radius_shape not in RADIUS_SHAPES:
            raise ValueError(f"--fourier-radius-shape must be one of {', '.join(RADIUS_SHAPES)}, got {radius_shape!r}")
        return cls(
            sites=parse_sites(get["performer_attention"], available, flag="--performer-attention"),
            kernel=kernel,
            num_features=int(get["performer_features"]),
            redraw_interval=int(get["performer_redraw_interval"]),
            feature_type=feature_type,
            power=int(power),
            radius_init=float(get["fourier_radius_init"]),
            radius_shape=radius_shape,
        )

    attention_class = PerformerMultiheadAttention

    def attention_kwargs(self):
        return dict(
            num_features=self.num_features,
            kernel=self.kernel,
            redraw_interval=self.redraw_interval,
            feature_type=self.feature_type,
            power=self.power,
            radius_init=self.radius_init,
            radius_shape=self.radius_shape,
        )

    @staticmethod
    def add_args(parser) -> None:
        add_performer_args(parser)

    @staticmethod
    def prepare_model(model, args) -> None:
        seed_performer_features(model, safe_getattr(args, "seed", 1))


def seed_performer_features(model, seed: int) -> None:
    """Draw 0 of every Performer attention from a seed of its own: hash(seed, module name)."""
    for name, module in model.named_modules():
        if isinstance(module, PerformerMultiheadAttention):
            module.redraw_features(draw=0, seed=feature_seed(int(seed), name))


__all__ = [
    "PerformerAttentionOptions",
    "PerformerConfig",
    "SITES",
    "add_performer_args",
    "seed_performer_features",
    "set_performer_defaults",
]
