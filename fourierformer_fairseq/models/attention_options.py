"""The attention sites of the architectures, and what they need of an attention options object.

An options object (``FourierAttentionOptions``, ``PerformerAttentionOptions``) is read and validated
from the fairseq args by ``from_args(args, available_sites)``; it has ``sites``, the sites whose
attention it replaces, and ``build_attention(site, embed_dim, num_heads, **kwargs)``, which makes
the attention of one site: its own ``attention_class`` if the site is selected, fairseq's softmax
``MultiheadAttention`` otherwise. ``add_args(parser)`` declares its command-line options and
``prepare_model(model, args)`` finishes a built model (called once, after every module exists).
"""

from typing import Any, ClassVar, Dict, FrozenSet, Type

from fairseq.modules.multihead_attention import MultiheadAttention

SITES = ("encoder", "decoder", "cross")
LM_SITES = ("decoder",)  # a language model has only decoder self-attention


class AttentionOptions:
    """The shared behaviour of the attention options dataclasses (which declare ``sites``)."""

    attention_class: ClassVar[Type[MultiheadAttention]]
    sites: FrozenSet[str]

    def attention_kwargs(self) -> Dict[str, Any]:
        """The keyword arguments of ``attention_class`` beyond fairseq's ``MultiheadAttention``'s."""
        raise NotImplementedError

    def build_attention(self, site: str, embed_dim: int, num_heads: int, **kwargs) -> MultiheadAttention:
        """The attention for ``site``: ``attention_class`` if selected, else fairseq's MultiheadAttention."""
        if site not in SITES:
            raise ValueError(f"unknown attention site {site!r}; expected one of {SITES}")
        if site not in self.sites:
            return MultiheadAttention(embed_dim, num_heads, **kwargs)
        return self.attention_class(embed_dim, num_heads, **self.attention_kwargs(), **kwargs)

    @staticmethod
    def add_args(parser) -> None:
        raise NotImplementedError

    @staticmethod
    def prepare_model(model, args) -> None:
        """Finishes a built model; nothing by default."""


__all__ = ["LM_SITES", "SITES", "AttentionOptions"]
