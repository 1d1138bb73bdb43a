"""fairseq modules of the plugin, and a small registry of attention modules by name.

    from fourierformer_fairseq.modules import build_attention
    attn = build_attention("fourier_multihead_attention", 512, 8, self_attention=True, power=2)

``ATTENTION_REGISTRY`` maps "multihead_attention" to fairseq's ``MultiheadAttention``,
"fourier_multihead_attention" to :class:`FourierMultiheadAttention` and
"performer_multihead_attention" to :class:`PerformerMultiheadAttention` and
"global_filter_mixer" to :class:`GlobalFilterMixer`. Every kind is a
:class:`ProjectedMultiheadAttention` (the shared forward) and imports no other kind.
"""
from typing import Callable, Dict, Type

from fairseq.modules.multihead_attention import MultiheadAttention

from .fourier_multihead_attention import FourierMultiheadAttention
from .global_filter_mixer import GlobalFilterMixer
from .performer_multihead_attention import PerformerMultiheadAttention
from .projected_attention import RADIUS_SHAPES, ProjectedMultiheadAttention

ATTENTION_REGISTRY: Dict[str, Type[MultiheadAttention]] = {}


def register_attention(name: str) -> Callable[[Type[MultiheadAttention]], Type[MultiheadAttention]]:
    """Class decorator: make an attention class available to ``build_attention`` as ``name``."""

    def register(cls):
        if name in ATTENTION_REGISTRY and ATTENTION_REGISTRY[name] is not cls:
            raise ValueError(f"attention {name!r} is already registered to {ATTENTION_REGISTRY[name].__name__}")
        ATTENTION_REGISTRY[name] = cls
        return cls

    return register


def build_attention(name: str, *args, **kwargs) -> MultiheadAttention:
    """Instantiate the attention registered as ``name`` with the given constructor arguments."""
    if name not in ATTENTION_REGISTRY:
        raise ValueError(f"unknown attention {name!r}; registered: {sorted(ATTENTION_REGISTRY)}")
    return ATTENTION_REGISTRY[name](*args, **kwargs)


register_attention("multihead_attention")(MultiheadAttention)
register_attention("fourier_multihead_attention")(FourierMultiheadAttention)
register_attention("performer_multihead_attention")(PerformerMultiheadAttention)
register_attention("global_filter_mixer")(GlobalFilterMixer)

__all__ = [
    "ATTENTION_REGISTRY",
    "FourierMultiheadAttention",
    "GlobalFilterMixer",
    "PerformerMultiheadAttention",
    "ProjectedMultiheadAttention",
    "RADIUS_SHAPES",
    "build_attention",
    "register_attention",
]

