"""The Fourier kernel's options (its power p and radius R), one declaration that every attention
kind with a Fourier kernel imports: Fourier attention (``FourierAttentionConfig``, ``fourierformer.py``)
and the Performer's ``fourier_rf`` random features (``PerformerConfig``, ``performer.py``). No
attention kind's file imports another kind's; what they share lives here.
"""

from dataclasses import dataclass
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from fourierformer_fairseq.ops.inputs import RADIUS_SHAPES

from .attention_options import kwarg_field


@dataclass
class FourierKernelConfig(FairseqDataclass):
    """The Fourier kernel's options, shared by Fourier attention and the Performer's fourier_rf kernel.

    ``None``: the architecture's default (set by its arch function), else the attention class's.
    """

    fourier_power: Optional[int] = kwarg_field(
        "power", None, "p of phi(x) = x^p in the Fourier kernel prod_d phi(sinc(R (q_d - k_d))) (even for the "
                       "Performer's fourier_rf); default: 2 translation, 4 language models")
    fourier_radius_init: Optional[float] = kwarg_field(
        "radius_init", None, "initial value of the learnable radius R; default: Fourier attention "
                             "sqrt(3 / (p sqrt(head_dim))) (as peaked as softmax at init), or the paper's with "
                             "--fourier-paper-exact; Performer fourier_rf the paper's (1.0 translation, 2.0 language models)")
    fourier_radius_shape: ChoiceEnum(RADIUS_SHAPES) = kwarg_field(
        "radius_shape", "scalar", "one learnable radius per layer (scalar), per head, per head and feature, or per feature "
                         "shared by the heads (vector: the paper's learnable vector R)")


__all__ = ["FourierKernelConfig"]
