"""The plugin's architectures for fairseq (every file of this folder is imported, and registers, on import).

Translation: model ``fourierformer``, arch ``fourierformer_iwslt_de_en`` (twin: stock
``transformer_iwslt_de_en``). Language modelling: model ``fourierformer_lm``, archs
``fourierformer_lm_wiki103_small`` / ``_medium`` (twins ``softmax_lm_wiki103_small`` / ``_medium``
on ``softmax_lm``: stock ``transformer_lm`` with the plugin's LM options).
"""
# fairseq first: its import ends with the plugin's registration (fourierformer_fairseq/__init__.py),
# which imports this package's modules; imported from inside one of them, it would meet them half made
import fairseq  # noqa: F401  (isort: skip)

import importlib
import pkgutil

from .attention_options import SITES
from .fourierformer import (FourierAttentionOptions, FourierFormerLanguageModel, FourierFormerLanguageModelConfig,
                            FourierFormerModel)

# every module of this folder, as fairseq's own models/__init__.py does: an attention kind's file
# (its options, models and archs) registers them on import, so a new kind adds a file and edits none here
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

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
]
