"""The attention sites of the architectures, and an attention kind's options, declared once.

A kind's options are one fairseq dataclass (``FourierAttentionConfig``, ``PerformerConfig``,
``GlobalFilterConfig``): the translation models add it to their argparse options, the language
models' configs inherit it. A field whose metadata names a ``kwarg`` is passed to the kind's
attention class as that keyword argument; the ``sites_field`` selects the sites the kind replaces;
other fields are for the architecture functions (defaults, switches). Adding an option is the
field and the code that uses it (the attention class's constructor): reading, passing and
validating are generic.

An ``AttentionOptions`` subclass names ``config_class``, ``attention_class`` and ``sites_field``.
``from_args(args, available_sites)`` reads the fields from fairseq's args, validates them once
with the attention class's ``check_options`` (the same validation its constructor runs; errors
name the flags here), and gives an object with ``sites`` and ``build_attention(site, embed_dim,
num_heads, **kwargs)``, which makes the attention of one site: the kind's if the site is
selected, fairseq's softmax ``MultiheadAttention`` otherwise. ``add_args(parser)`` declares the
options and ``prepare_model(model, args)`` finishes a built model (called once, after every
module exists).
"""

import enum
import itertools
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Dict, FrozenSet, Sequence, Type

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.modules.multihead_attention import MultiheadAttention
from fairseq.utils import safe_getattr

from fourierformer_fairseq import __version__
from fourierformer_fairseq.modules.option_checks import OptionError

SITES = ("encoder", "decoder", "cross")
LM_SITES = ("decoder",)  # a language model has only decoder self-attention


SITE_HELP = {
    "encoder": "encoder self-attention",
    "decoder": "decoder (causal) self-attention",
    "cross": "decoder encoder-decoder attention",
}


@dataclass
class PluginVersionConfig(FairseqDataclass):
    """What every model of the plugin records in its checkpoints' ``cfg.model`` (the language models'
    config inherits it, the translation models add it to their parser)."""

    fourierformer_version: str = field(
        default=__version__, metadata={"help": "the fourierformer-fairseq version that trained the model, "
                                               "recorded in its checkpoints (set by the plugin; not to be given)"})


def site_tag(module_name: str) -> str:
    """The short tag of an attention module's site from its name in the model: "enc" (encoder
    self-attention), "cross" (encoder-decoder attention) or "dec" (decoder self-attention)."""
    if module_name.split(".")[0] == "encoder":
        return "enc"
    return "cross" if module_name.split(".")[-1] == "encoder_attn" else "dec"


def site_choices(sites: Sequence[str] = SITES):
    """The values of a kind's sites option, for its field's type (the parser refuses any other): all,
    none, and every non-empty subset of ``sites``, comma-separated in their order."""
    subsets = [",".join(c) for n in range(1, len(sites) + 1) for c in itertools.combinations(sites, n)]
    return ChoiceEnum(["all", "none"] + subsets)


def parse_sites(spec, available: Sequence[str], flag: str, supported: Sequence[str] = SITES) -> FrozenSet[str]:
    """'encoder,decoder,cross' / 'all' / 'none' (the value of ``flag``) -> the set of sites it selects.

    available: the model's sites; supported: the sites the kind can replace ('all' is their common part).
    """
    available = [s for s in available if s in supported]
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
    unsupported = [s for s in items if s not in supported]
    if unsupported:
        raise ValueError(
            f"{flag} {spec!r}: this attention kind cannot replace the {', '.join(SITE_HELP[s] for s in unsupported)} "
            f"(it stays softmax); choose from {','.join(available)} (or 'all' / 'none')"
        )
    missing = [s for s in items if s not in available]
    if missing:
        raise ValueError(
            f"{flag} {spec!r}: this model has no {', '.join(SITE_HELP[s] for s in missing)}; "
            f"choose from {','.join(available)} (or 'all' / 'none')"
        )
    return frozenset(items)


def kwarg_field(kwarg: str, default: Any, help: str, **metadata) -> Any:
    """A config field passed to the attention class as the keyword argument ``kwarg``."""
    return field(default=default, metadata={"help": help, "kwarg": kwarg, **metadata})


def choice_value(value: Any) -> Any:
    """A ChoiceEnum member as its string; anything else as it is (the one reader of fairseq's choice enums:
    an option parsed into a ChoiceEnum field may reach the models as a member or as its string)."""
    return value.value if isinstance(value, enum.Enum) else value


class AttentionOptions:
    """A kind's options read from fairseq's args: ``sites`` and the attention class's keyword arguments."""

    config_class: ClassVar[Type[FairseqDataclass]]
    attention_class: ClassVar[Type[MultiheadAttention]]
    sites_field: ClassVar[str]
    #: the sites the kind can replace
    supported_sites: ClassVar[Sequence[str]] = SITES
    #: argparse without the dataclass defaults (the arch functions fill in what is unset)
    parser_without_defaults: ClassVar[bool] = False

    def __init__(self, sites: FrozenSet[str], kwargs: Dict[str, Any]):
        self.sites = frozenset(sites)
        self.kwargs = dict(kwargs)

    def __getattr__(self, name: str) -> Any:
        """An option by its keyword: its value, or None where it was left unset (the attention class's default)."""
        if name.startswith("__") or name == "kwargs":
            raise AttributeError(name)
        kwargs = self.__dict__.get("kwargs", {})
        if name in kwargs:
            return kwargs[name]
        if getattr(type(self), "config_class", None) is not None and name in self.kwarg_fields():
            return None
        raise AttributeError(f"{type(self).__name__} has no option {name!r}")

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and (self.sites, self.kwargs) == (other.sites, other.kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sites={sorted(self.sites)}, {self.kwargs})"

    # ------------------------------------------------------------------ reading

    @classmethod
    def kwarg_fields(cls) -> Dict[str, str]:
        """keyword argument -> config field, for every field that names one."""
        return {f.metadata["kwarg"]: f.name for f in fields(cls.config_class) if "kwarg" in f.metadata}

    @classmethod
    def flags(cls) -> Dict[str, str]:
        """keyword argument -> its command-line flag."""
        return {kw: "--" + name.replace("_", "-") for kw, name in cls.kwarg_fields().items()}

    @classmethod
    def read_kwargs(cls, args) -> Dict[str, Any]:
        """The attention class's keyword arguments from args; a field left None is left out (the class's default)."""
        defaults = {f.name: f.default for f in fields(cls.config_class)}
        kwargs = {kw: choice_value(safe_getattr(args, name, defaults[name])) for kw, name in cls.kwarg_fields().items()}
        return {kw: value for kw, value in kwargs.items() if value is not None}

    @classmethod
    def from_args(cls, args, available: Sequence[str] = SITES) -> "AttentionOptions":
        """Reads and validates the kind's options from a fairseq args namespace / config."""
        kwargs = cls.read_kwargs(args)
        try:
            cls.attention_class.check_options(kwargs)
        except OptionError as error:
            raise ValueError(error.render(cls.flags())) from None
        default_sites = next(f.default for f in fields(cls.config_class) if f.name == cls.sites_field)
        sites = parse_sites(choice_value(safe_getattr(args, cls.sites_field, default_sites)), available,
                            flag="--" + cls.sites_field.replace("_", "-"), supported=cls.supported_sites)
        return cls(sites, kwargs)

    def attention_kwargs(self) -> Dict[str, Any]:
        """The keyword arguments of ``attention_class`` beyond fairseq's ``MultiheadAttention``'s."""
        return dict(self.kwargs)

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

    @classmethod
    def add_args(cls, parser) -> None:
        """Adds the kind's options to a legacy (argparse) model's parser."""
        gen_parser_from_dataclass(parser, cls.config_class(), delete_default=cls.parser_without_defaults)

    @classmethod
    def set_defaults(cls, args, **overrides) -> None:
        """For architecture functions: every config field the command line left unset takes
        ``overrides[name]`` or else the declared default (a None default stays unset)."""
        for f in fields(cls.config_class):
            if f.name.startswith("_") or safe_getattr(args, f.name, None) is not None:
                continue
            value = overrides.get(f.name, f.default)
            if value is not None:
                setattr(args, f.name, value)

    @staticmethod
    def prepare_model(model, args) -> None:
        """Finishes a built model; nothing by default."""


__all__ = ["LM_SITES", "SITES", "AttentionOptions", "PluginVersionConfig", "choice_value", "kwarg_field", "parse_sites",
           "site_choices", "site_tag"]
