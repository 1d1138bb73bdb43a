"""FourierFormer architectures for fairseq (registered on import).

Translation: model ``fourierformer``, arch ``fourierformer_iwslt_de_en`` (twin: stock
``transformer_iwslt_de_en``). Language modelling: model ``fourierformer_lm``, archs
``fourierformer_lm_wiki103_small`` / ``_medium`` (twins ``softmax_lm_wiki103_small`` / ``_medium``
on stock ``transformer_lm``).
"""
from .fourier_attention_options import SITES, FourierAttentionOptions
from .fourierformer_lm import FourierFormerLanguageModel, FourierFormerLanguageModelConfig
from .fourierformer_transformer import (
    FourierFormerModel,
    FourierTransformerDecoder,
    FourierTransformerDecoderLayer,
    FourierTransformerEncoder,
    FourierTransformerEncoderLayer,
)
from .performer_lm import PerformerLanguageModel  # noqa: F401  (Performer: performer_lm_wiki103_small / _medium)
from .performer_transformer import PerformerModel  # noqa: F401  (Performer: performer_iwslt_de_en)
from .gfnet_lm import GlobalFilterLanguageModel  # noqa: F401  (global filter: gfnet_lm_wiki103_small / _medium)
from .gfnet_transformer import GlobalFilterModel  # noqa: F401  (global filter: gfnet_iwslt_de_en)

FOURIER_ARCHS = ("fourierformer_iwslt_de_en", "fourierformer_lm_wiki103_small", "fourierformer_lm_wiki103_medium")
SOFTMAX_TWINS = {
    "fourierformer_iwslt_de_en": "transformer_iwslt_de_en",
    "fourierformer_lm_wiki103_small": "softmax_lm_wiki103_small",
    "fourierformer_lm_wiki103_medium": "softmax_lm_wiki103_medium",
}

__all__ = [
    "FOURIER_ARCHS",
    "SITES",
    "SOFTMAX_TWINS",
    "FourierAttentionOptions",
    "FourierFormerLanguageModel",
    "FourierFormerLanguageModelConfig",
    "FourierFormerModel",
    "FourierTransformerDecoder",
    "FourierTransformerDecoderLayer",
    "FourierTransformerEncoder",
    "FourierTransformerEncoderLayer",
]
