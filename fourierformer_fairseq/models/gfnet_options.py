"""The ``--gfnet-*`` options of the global-filter architectures, declared once.

``GlobalFilterConfig`` is the one declaration (a fairseq dataclass): the translation model adds it
to its argparse options, the language model's config inherits it; ``GlobalFilterOptions`` reads,
validates (``GlobalFilterMixer.check_options``) and passes them (see ``attention_options``). The
filter replaces self-attention only: ``--gfnet-attention`` selects among encoder and decoder, and
encoder-decoder attention stays softmax.
"""
from dataclasses import dataclass, field

from fairseq.dataclass import FairseqDataclass

from fourierformer_fairseq.modules.global_filter_mixer import GlobalFilterMixer

from .attention_options import AttentionOptions, kwarg_field, site_choices


@dataclass
class GlobalFilterConfig(FairseqDataclass):
    """Every --gfnet-* option."""

    gfnet_init_std: float = kwarg_field(
        "init_std", 0.02, "standard deviation of the global filter's initial time-domain taps (GFNet's 0.02)")
    gfnet_attention: site_choices() = field(
        default="all", metadata={"help": "comma-separated self-attentions replaced by the global filter, from "
                                         "encoder,decoder in this order (or all / none); the others, and "
                                         "encoder-decoder attention, stay softmax"})


class GlobalFilterOptions(AttentionOptions):
    """The --gfnet-* options of a model: ``sites`` and GlobalFilterMixer's keyword arguments."""

    config_class = GlobalFilterConfig
    attention_class = GlobalFilterMixer
    sites_field = "gfnet_attention"
    supported_sites = ("encoder", "decoder")


__all__ = ["GlobalFilterConfig", "GlobalFilterOptions"]
