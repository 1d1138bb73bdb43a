"""The ``--fourier-*`` options shared by every FourierFormer architecture, declared once.

``FourierAttentionConfig`` is the one declaration (a fairseq dataclass): the translation model
adds it to its argparse options with ``gen_parser_from_dataclass``, the language model's config
inherits it. Architecture functions fill in their defaults with ``set_fourier_defaults``;
``FourierAttentionOptions.from_args`` validates them once, with clear errors, and
``build_attention`` makes the attention of one site: Fourier if the site is selected, fairseq's
softmax ``MultiheadAttention`` otherwise.

Defaults (why: docs/training-dynamics.md): queries and keys normalised to unit RMS per head
(``--fourier-qk-norm rms``) and the radius started at ``sqrt(3 / (p sqrt(head_dim)))``, where
the kernel is as peaked as softmax attention at initialisation; ``--fourier-paper-exact`` selects
the paper's formulation instead (no normalisation, the paper's radius init: 1.0 for translation,
2.0 for the language models; exact normalisation over the keys, without the published code's
``+ 1e-6``).
"""

from dataclasses import dataclass, field, fields
from typing import FrozenSet, Optional, Sequence

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.utils import safe_getattr

from fourierformer_fairseq.modules.fourier_multihead_attention import (
    KERNELS,
    QK_NORMS,
    RADIUS_SHAPES,
    FourierMultiheadAttention,
)
from fourierformer_fairseq.ops.inputs import PHIS

from .attention_options import SITES, AttentionOptions, parse_sites

@dataclass
class FourierAttentionConfig(FairseqDataclass):
    """Every --fourier-* option. ``None`` means: the architecture's default (see set_fourier_defaults)."""

    fourier_power: Optional[int] = field(
        default=None, metadata={"help": "p of phi(x) = x^p in the Fourier attention weights "
                                        "prod_d phi(sinc(R (q_d - k_d))); default: 2 translation, 4 language models"})
    fourier_phi: ChoiceEnum(PHIS) = field(
        default="power", metadata={"help": "phi applied to sinc: power (x^p, the paper's), abs, relu or sigmoid"})
    fourier_radius_init: Optional[float] = field(
        default=None, metadata={"help": "initial value of the learnable radius R; default: sqrt(3 / (p sqrt(head_dim))) "
                                        "(as peaked as softmax at init), or the paper's with --fourier-paper-exact"})
    fourier_radius_shape: ChoiceEnum(RADIUS_SHAPES) = field(
        default="scalar", metadata={"help": "one learnable radius per layer (scalar), per head, or per head and feature"})
    fourier_qk_norm: Optional[str] = field(
        default=None, metadata={"help": "rms: divide q and k by their RMS over the head dim before scoring "
                                        "(default); none: the paper's (default with --fourier-paper-exact)"})
    fourier_kernel: ChoiceEnum(KERNELS) = field(
        default="sinc", metadata={"help": "sinc: Fourier integral attention; gaussian: the ablation "
                                          "exp(-(p R^2 / 6) |q - k|^2), sinc's small-argument limit"})
    fourier_paper_exact: bool = field(
        default=False, metadata={"help": "the paper's formulation: no q/k normalisation, the paper's radius init "
                                         "(exact normalisation over keys, without the published code's + 1e-6)"})
    fourier_attention: str = field(
        default="all", metadata={"help": "comma-separated attentions that are Fourier, from encoder,decoder,cross "
                                         "(or all / none); the others stay softmax"})
    fourier_log_interval: int = field(
        default=0, metadata={"help": "every N updates, log each Fourier layer's radius (radius_<layer>) and the mean "
                                     "attention entropy per site (entropy_<site>, nats) through fairseq's metrics; 0: off"})


def declared_default(name: str):
    """The default ``FourierAttentionConfig`` declares for the option ``name`` (e.g. "fourier_phi")."""
    return _DECLARED_DEFAULTS[name]


_DECLARED_DEFAULTS = {f.name: f.default for f in fields(FourierAttentionConfig)}


def add_fourier_args(parser) -> None:
    """Adds the --fourier-* options to a legacy (argparse) model's parser."""
    gen_parser_from_dataclass(parser, FourierAttentionConfig())


@dataclass(frozen=True)
class FourierAttentionOptions(AttentionOptions):
    sites: FrozenSet[str]
    power: int
    phi: str
    radius_init: Optional[float]  # None: auto_radius(power, head_dim)
    radius_shape: str
    qk_norm: str
    kernel: str
    log_interval: int

    @classmethod
    def from_args(cls, args, available: Sequence[str]) -> "FourierAttentionOptions":
        """Reads and validates the fourier_* fields of a fairseq args namespace / config."""
        power = safe_getattr(args, "fourier_power", None)
        if power is None:
            raise ValueError("--fourier-power is not set; use a FourierFormer --arch (it sets the defaults)")
        # The arch functions always set it; it is missing only from the saved options of checkpoints
        # trained before it existed, which used the paper's formulation and must be rebuilt that way.
        qk_norm = safe_getattr(args, "fourier_qk_norm", None) or "none"
        phi = str(safe_getattr(args, "fourier_phi", declared_default("fourier_phi")))
        radius_init = safe_getattr(args, "fourier_radius_init", None)
        radius_shape = str(safe_getattr(args, "fourier_radius_shape", declared_default("fourier_radius_shape")))
        kernel = str(safe_getattr(args, "fourier_kernel", declared_default("fourier_kernel")))
        log_interval = safe_getattr(args, "fourier_log_interval", declared_default("fourier_log_interval"))
        if isinstance(power, bool) or int(power) != power or int(power) < 1:
            raise ValueError(f"--fourier-power must be a positive integer, got {power!r}")
        for flag, value, allowed in (("--fourier-phi", phi, PHIS), ("--fourier-radius-shape", radius_shape, RADIUS_SHAPES),
                                     ("--fourier-qk-norm", str(qk_norm), QK_NORMS), ("--fourier-kernel", kernel, KERNELS)):
            if value not in allowed:
                raise ValueError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}")
        if radius_init is not None and not float(radius_init) > 0:
            raise ValueError(f"--fourier-radius-init must be positive, got {radius_init!r}")
        if kernel == "gaussian" and phi != "power":
            raise ValueError(f"--fourier-kernel gaussian takes --fourier-phi power, got {phi!r}")
        if isinstance(log_interval, bool) or int(log_interval) != log_interval or int(log_interval) < 0:
            raise ValueError(f"--fourier-log-interval must be a non-negative integer, got {log_interval!r}")
        return cls(
            sites=parse_sites(safe_getattr(args, "fourier_attention", declared_default("fourier_attention")), available,
                              flag="--fourier-attention"),
            power=int(power),
            phi=phi,
            radius_init=None if radius_init is None else float(radius_init),
            radius_shape=radius_shape,
            qk_norm=str(qk_norm),
            kernel=kernel,
            log_interval=int(log_interval),
        )

    attention_class = FourierMultiheadAttention

    def attention_kwargs(self):
        return dict(
            power=self.power,
            phi=self.phi,
            radius_init=self.radius_init,
            radius_shape=self.radius_shape,
            qk_norm=self.qk_norm,
            kernel=self.kernel,
            log_interval=self.log_interval,
        )

    @staticmethod
    def add_args(parser) -> None:
        add_fourier_args(parser)

    @staticmethod
    def prepare_model(model, args) -> None:
        name_fourier_layers(model)


def set_fourier_defaults(args, *, power: int, paper_radius_init: float) -> None:
    """For architecture functions: fill in what the command line left unset.

    power: the arch's p. paper_radius_init: the paper's initial radius for this arch, used with
    --fourier-paper-exact (otherwise the radius starts at auto_radius unless given).
    """
    paper = bool(safe_getattr(args, "fourier_paper_exact", False))
    if safe_getattr(args, "fourier_power", None) is None:
        args.fourier_power = power
    if safe_getattr(args, "fourier_qk_norm", None) is None:
        args.fourier_qk_norm = "none" if paper else "rms"
    if paper and safe_getattr(args, "fourier_radius_init", None) is None:
        args.fourier_radius_init = paper_radius_init
    for key, value in _DECLARED_DEFAULTS.items():  # the rest: as FourierAttentionConfig declares them
        if value is not None and safe_getattr(args, key, None) is None:
            setattr(args, key, value)


def name_fourier_layers(model) -> None:
    """Sets each Fourier attention's ``log_name`` from its place: enc<i>, dec<i> (self), cross<i>."""
    for name, module in model.named_modules():
        if not isinstance(module, FourierMultiheadAttention):
            continue
        parts = name.split(".")
        index = next((p for p in reversed(parts) if p.isdigit()), "")
        if parts[0] == "encoder":
            module.log_name = f"enc{index}"
        elif parts[-1] == "encoder_attn":
            module.log_name = f"cross{index}"
        else:
            module.log_name = f"dec{index}"


__all__ = [
    "FourierAttentionConfig",
    "FourierAttentionOptions",
    "name_fourier_layers",
    "SITES",
    "add_fourier_args",
    "parse_sites",
    "set_fourier_defaults",
]
