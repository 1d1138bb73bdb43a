"""Options of every language model of the plugin (each attention kind's and the softmax twins'), declared once.

``LanguageModelConfig`` is fairseq's ``transformer_lm`` config plus what the published FourierFormer
code's language models have and fairseq's do not (docs/published-model.md, the status table):

- ``--lm-layernorm post``: post-LN blocks without a final LayerNorm. fairseq's
  ``base_lm_architecture`` forces ``decoder_normalize_before=True`` (pre-LN); this sets it back
  when the model is built, so the saved config and a reloaded model agree.
- ``--lm-init published``: the published ``weights_init``: every Linear weight N(0, 0.02), every
  embedding N(0, 0.02) (fairseq's decoder multiplies them by sqrt(d) in the forward, as the
  published code does), LayerNorm weights N(1, 0.02), every bias 0. fairseq's adaptive input keeps a
  d x d projection per band (and the adaptive softmax's tails reuse them with
  ``--tie-adaptive-proj``) where the published model at ``div_val`` 1 has none: they start at the
  identity, so that the model at initialisation computes what the published one does.
- ``--no-softmax-proj-bias``: the softmax attentions' q, k, v and output projections without biases,
  as the published softmax baseline's. fairseq's ``MultiheadAttention`` concatenates the three input
  biases in its fast path, so each bias becomes a zero buffer of the same name (no parameter, same
  state-dict keys, nothing to learn).

``prepare_args`` runs before the decoder is built, ``finish_model`` after (both from
``AttentionKindLanguageModel.build_model``).
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from fairseq.dataclass import ChoiceEnum
from fairseq.models.transformer_lm import TransformerLanguageModelConfig
from fairseq.modules import AdaptiveInput
from fairseq.modules.adaptive_softmax import AdaptiveSoftmax
from fairseq.modules.multihead_attention import MultiheadAttention
from fairseq.utils import safe_getattr

from fourierformer_fairseq.modules.projected_attention import ProjectedMultiheadAttention

from .attention_options import PluginVersionConfig, choice_value

LM_INITS = ("fairseq", "published")
LM_LAYERNORMS = ("pre", "post")
#: the published code's ``--init_std``: every Linear and embedding weight N(0, std), LayerNorm weights N(1, std)
PUBLISHED_INIT_STD = 0.02


@dataclass
class LanguageModelConfig(TransformerLanguageModelConfig, PluginVersionConfig):
    """``transformer_lm``'s options plus the published model's LayerNorm placement, init and attention biases."""

    lm_layernorm: ChoiceEnum(LM_LAYERNORMS) = field(
        default="pre", metadata={"help": "pre: pre-LN blocks and a final LayerNorm (fairseq's transformer_lm); "
                                         "post: post-LN blocks without a final LayerNorm (the published model)"})
    lm_init: ChoiceEnum(LM_INITS) = field(
        default="fairseq", metadata={"help": "fairseq: fairseq's initialisation; published: the published code's "
                                             "(every Linear and embedding weight N(0, 0.02), LayerNorm weights "
                                             "N(1, 0.02), biases 0, the adaptive input's band projections the identity)"})
    no_softmax_proj_bias: bool = field(
        default=False, metadata={"help": "no biases in the softmax attentions' q, k, v and output projections "
                                         "(the published softmax baseline); biases of 0 that do not train"})


def _choice(args, name: str, default: str, choices) -> str:
    """args' value of a ChoiceEnum field (an enum member or its string), checked against choices."""
    value = str(choice_value(safe_getattr(args, name, default)))
    if value not in choices:
        raise ValueError(f"--{name.replace('_', '-')} {value!r}: expected one of {', '.join(choices)}")
    return value


def prepare_args(args) -> None:
    """Before the decoder is built: the LayerNorm placement (base_lm_architecture has forced pre-LN)."""
    if _choice(args, "lm_layernorm", "pre", LM_LAYERNORMS) == "post":
        args.decoder_normalize_before = False


def finish_model(model, args) -> None:
    """After the model is built: the softmax attentions' biases, then the init."""
    if safe_getattr(args, "no_softmax_proj_bias", False):
        drop_softmax_biases(model)
    if _choice(args, "lm_init", "fairseq", LM_INITS) == "published":
        published_init(model)


def softmax_attentions(model):
    """fairseq's softmax MultiheadAttention modules of a model (not an attention kind's)."""
    return [m for m in model.modules()
            if isinstance(m, MultiheadAttention) and not isinstance(m, ProjectedMultiheadAttention)]


def drop_softmax_biases(model) -> None:
    for attention in softmax_attentions(model):
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj):
            if isinstance(proj.bias, nn.Parameter):
                zeros = torch.zeros_like(proj.bias.data)
                del proj.bias
                proj.register_buffer("bias", zeros)


@torch.no_grad()
def published_init(model, std: float = PUBLISHED_INIT_STD) -> None:
    """The published code's ``weights_init`` on a fairseq language model (see the module docstring)."""
    identity = set()  # the adaptive input's band projections and the adaptive softmax's own tail projections
    for module in model.modules():
        if isinstance(module, AdaptiveInput):
            for band in module.embeddings:
                identity.add(band[1])
        if isinstance(module, AdaptiveSoftmax):
            for tail in module.tail:
                first = tail[0]
                if isinstance(first, nn.Linear) and first.weight.shape[0] == first.weight.shape[1]:
                    identity.add(first)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if module in identity:
                nn.init.eye_(module.weight)
            else:
                nn.init.normal_(module.weight, 0.0, std)
            if isinstance(module.bias, nn.Parameter):
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):  # fairseq's LayerNorm and FusedLayerNorm are subclasses
            if getattr(module, "weight", None) is not None:
                nn.init.normal_(module.weight, 1.0, std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


__all__ = ["LM_INITS", "LM_LAYERNORMS", "LanguageModelConfig", "PUBLISHED_INIT_STD", "drop_softmax_biases",
           "finish_model", "prepare_args", "published_init", "softmax_attentions"]
