"""The ``--fourier-*`` options shared by every FourierFormer architecture.

    --fourier-power P                          phi(x) = x^P (default: the arch's; 2 for translation, 4 for LM)
    --fourier-phi {power,abs,relu,sigmoid}
    --fourier-radius-init R                    initial radius (2.0 / 1.0 by arch)
    --fourier-radius-shape {scalar,head,feature}
    --fourier-attention encoder,decoder,cross  which attentions are Fourier ("all", "none" also accepted)

``FourierAttentionOptions.from_args`` validates them once, with clear errors, and
``build_attention`` makes the attention of one site: Fourier if the site is selected,
fairseq's softmax ``MultiheadAttention`` otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Sequence

from fairseq.modules.multihead_attention import MultiheadAttention
from fairseq.utils import safe_getattr

from fourierformer_fairseq.modules.fourier_multihead_attention import RADIUS_SHAPES, FourierMultiheadAttention
from fourierformer_fairseq.ops.inputs import PHIS

SITES = ("encoder", "decoder", "cross")
SITE_HELP = {
    "encoder": "encoder self-attention",
    "decoder": "decoder (causal) self-attention",
    "cross": "decoder encoder-decoder attention",
}


def parse_sites(spec, available: Sequence[str]) -> FrozenSet[str]:
    """'encoder,decoder,cross' / 'all' / 'none' -> the set of Fourier attention sites."""
    if isinstance(spec, (list, tuple, set, frozenset)):
        items = [str(s).strip() for s in spec]
    else:
        items = [s.strip() for s in str(spec).split(",")]
    items = [s for s in items if s]
    if items == ["all"]:
        return frozenset(available)
    if items == ["none"]:
        return frozenset()
    unknown = [s for s in items if s not in SITES]
    if unknown or not items:
        raise ValueError(
            f"--fourier-attention {spec!r}: expected a comma-separated subset of {','.join(available)} "
            f"(or 'all' / 'none')"
        )
    missing = [s for s in items if s not in available]
    if missing:
        raise ValueError(
            f"--fourier-attention {spec!r}: this model has no {', '.join(SITE_HELP[s] for s in missing)}; "
            f"choose from {','.join(available)} (or 'all' / 'none')"
        )
    return frozenset(items)


def add_fourier_args(parser, available: Sequence[str]) -> None:
    """Adds the --fourier-* options (no defaults here: the architecture functions set them)."""
    parser.add_argument("--fourier-power", type=int, metavar="P",
                        help="p of phi(x) = x^p in the Fourier attention weights prod_d phi(sinc(R (q_d - k_d)))")
    parser.add_argument("--fourier-phi", choices=PHIS,
                        help="phi applied to sinc: power (x^p, the paper's), abs, relu or sigmoid")
    parser.add_argument("--fourier-radius-init", type=float, metavar="R",
                        help="initial value of the learnable radius R")
    parser.add_argument("--fourier-radius-shape", choices=RADIUS_SHAPES,
                        help="one learnable radius per layer (scalar), per head, or per head and feature")
    parser.add_argument("--fourier-attention", metavar="SITES",
                        help=f"comma-separated attentions that are Fourier, from {','.join(available)} "
                             "(or all / none); the others stay softmax")


@dataclass(frozen=True)
class FourierAttentionOptions:
    sites: FrozenSet[str]
    power: int
    phi: str
    radius_init: float
    radius_shape: str

    @classmethod
    def from_args(cls, args, available: Sequence[str]) -> "FourierAttentionOptions":
        """Reads and validates the fourier_* fields of a fairseq args namespace / config."""
        power = safe_getattr(args, "fourier_power", None)
        phi = safe_getattr(args, "fourier_phi", None)
        radius_init = safe_getattr(args, "fourier_radius_init", None)
        radius_shape = safe_getattr(args, "fourier_radius_shape", None)
        sites = safe_getattr(args, "fourier_attention", None)
        for flag, value in (("--fourier-power", power), ("--fourier-phi", phi),
                            ("--fourier-radius-init", radius_init), ("--fourier-radius-shape", radius_shape),
                            ("--fourier-attention", sites)):
            if value is None:
                raise ValueError(f"{flag} is not set; use a FourierFormer --arch (it sets the defaults)")
        if isinstance(power, bool) or int(power) != power or int(power) < 1:
            raise ValueError(f"--fourier-power must be a positive integer, got {power!r}")
        if str(phi) not in PHIS:
            raise ValueError(f"--fourier-phi must be one of {', '.join(PHIS)}, got {phi!r}")
        if str(radius_shape) not in RADIUS_SHAPES:
            raise ValueError(f"--fourier-radius-shape must be one of {', '.join(RADIUS_SHAPES)}, got {radius_shape!r}")
        if not float(radius_init) > 0:
            raise ValueError(f"--fourier-radius-init must be positive, got {radius_init!r}")
        return cls(
            sites=parse_sites(sites, available),
            power=int(power),
            phi=str(phi),
            radius_init=float(radius_init),
            radius_shape=str(radius_shape),
        )

    def build_attention(self, site: str, embed_dim: int, num_heads: int, **kwargs) -> MultiheadAttention:
        """The attention for ``site``: Fourier if selected, else fairseq's MultiheadAttention."""
        if site not in SITES:
            raise ValueError(f"unknown attention site {site!r}; expected one of {SITES}")
        if site not in self.sites:
            return MultiheadAttention(embed_dim, num_heads, **kwargs)
        return FourierMultiheadAttention(
            embed_dim,
            num_heads,
            power=self.power,
            phi=self.phi,
            radius_init=self.radius_init,
            radius_shape=self.radius_shape,
            **kwargs,
        )


def set_fourier_defaults(args, *, power: int, radius_init: float, phi: str = "power",
                         radius_shape: str = "scalar", sites: str = "all") -> None:
    """For architecture functions: fill in the fourier_* options the command line left unset."""
    for key, value in (("fourier_power", power), ("fourier_phi", phi), ("fourier_radius_init", radius_init),
                       ("fourier_radius_shape", radius_shape), ("fourier_attention", sites)):
        current = safe_getattr(args, key, None)
        setattr(args, key, value if current is None else current)


__all__ = [
    "FourierAttentionOptions",
    "SITES",
    "add_fourier_args",
    "parse_sites",
    "set_fourier_defaults",
]
