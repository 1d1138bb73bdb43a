"""Offline quickstart: ``python -m fourierformer_fairseq.quickstart --help``.

Generates a synthetic parallel corpus (``corpus``), trains a FourierFormer and its softmax
twin with the stock fairseq command-line tools, and prints both test BLEU scores (``runner``).
"""
from .corpus import SOURCE_LANG, TARGET_LANG, Grammar, make_splits, write_corpus
from .runner import QuickstartConfig, QuickstartError, run_quickstart

__all__ = [
    "Grammar",
    "QuickstartConfig",
    "QuickstartError",
    "SOURCE_LANG",
    "TARGET_LANG",
    "make_splits",
    "run_quickstart",
    "write_corpus",
]
