"""fairseq modules of the plugin: one attention kind a file.

Every kind is a :class:`ProjectedMultiheadAttention` (the shared forward) and imports no other
kind: :class:`FourierMultiheadAttention`, :class:`PerformerMultiheadAttention` and
:class:`GlobalFilterMixer`. The models build them through their options classes
(``models/attention_options.py``).
"""
# fairseq first: its import ends with the plugin's registration (fourierformer_fairseq/__init__.py),
# which imports this package's modules; imported from inside one of them, it would meet them half made
import fairseq  # noqa: F401  (isort: skip)

from .fourier_multihead_attention import FourierMultiheadAttention
from .global_filter_mixer import GlobalFilterMixer
from .performer_multihead_attention import PerformerMultiheadAttention
from .projected_attention import ProjectedMultiheadAttention

__all__ = [
    "FourierMultiheadAttention",
    "GlobalFilterMixer",
    "PerformerMultiheadAttention",
    "ProjectedMultiheadAttention",
]
