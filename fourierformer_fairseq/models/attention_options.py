"""The attention sites of the architectures, and what they need of an attention options object.

An options object (``FourierAttentionOptions``, ``PerformerAttentionOptions``) is read and validated
from the fairseq args by ``from_args(args, available_sites)``; it has ``sites``, the sites whose
attention it replaces, and ``build_attention(site, embed_dim, num_heads, **kwargs)``, which makes
the attention of one site: its own ``attention_class`` if the site is selected, fairseq's softmax
``MultiheadAttention`` otherwise. ``add_args(parser)`` declares its command-line options and
``prepare_model(model, args)`` finishes a built model (called once, after every module exists).
"""

from typing import Any, ClassVar, Dict, FrozenSet, Sequence, Type

from fairseq.modules.multihead_attention import MultiheadAttention

SITES = ("encoder", "decoder", "cross")
LM_SITES = ("decoder",)  # a language model has only decoder self-attention


SITE_HELP = {
    "encoder": "encoder self-attention",
    "decoder": "decoder (causal) self-attention",
    "cross": "decoder encoder-decoder attention",
}


def parse_sites(spec, available: Sequence[str], flag: str) -> FrozenSet[str]:
    """'encoder,decoder,cross' / 'all' / 'none' (the value of ``flag``) -> the set of sites it selects."""
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
            f"{flag} {spec!r}: expected a comma-separated subset of {','.join(available)} "
            f"(or 'all' / 'none')"
        )
    missing = [s for s in items if s not in available]
    if missing:
        raise ValueError(
            f"{flag} {spec!r}: this model has no {', '.join(SITE_HELP[s] for s in missing)}; "
            f"choose from {','.join(available)} (or 'all' / 'none')"
        )
    return frozenset(items)


class AttentionOptions:
    """The shared behaviour of the attention options dataclasses (which declare ``sites``)."""

    attention_class: ClassVar[Type[MultiheadAttention]]
    sites: FrozenSet[str]

    def attention_kwargs(self) -> Dict[str, Any]:
        """The keyword arguments of ``attention_class`` beyond fairseq's ``MultiheadAttention``'s."""
        raise NotImplementedError

    def build_attention(self, site: str, embed_dim: int, num_heads: int, *, causal: bool = False,
                        max_positions=None, **kwargs) -> MultiheadAttention:
        """The attention for ``site``: ``attention_class`` if selected, else fairseq's MultiheadAttention.

        causal, max_positions: what the layer says of this attention (see ``ProjectedMultiheadAttention``);
        fairseq's softmax attention takes its future mask instead and needs neither.
        """
        if site not in SITES:
            raise ValueError(f"unknown attention site {site!r}; expected one of {SITES}")
        if site not in self.sites:
            return MultiheadAttention(embed_dim, num_heads, **kwargs)
        return self.attention_class(embed_dim, num_heads, **self.attention_kwargs(), causal=causal,
                                    max_positions=max_positions, **kwargs)

    @staticmethod
    def add_args(parser) -> None:
        raise NotImplementedError

    @staticmethod
    def prepare_model(model, args) -> None:
        """Finishes a built model; nothing by default."""


__all__ = ["LM_SITES", "SITES", "AttentionOptions", "parse_sites"]
