"""``GlobalFilterMixer``: a GFNet-style global filter (Rao et al., NeurIPS 2021) at a self-attention site.

GFNet replaces self-attention by a learnable filter applied in the frequency domain: FFT over the
tokens, an elementwise product with a filter per channel, inverse FFT. Here, at a fairseq
self-attention site: ``out_proj(filter * v_proj(x))``, the filter a long convolution per channel
(embed_dim channels) over the positions, computed by :func:`fourierformer_fairseq.ops.global_filter.global_filter`.

- The filter is parameterised in the time domain, one tap per lag (``filter``: (embed_dim, L) for
  the causal decoder, (embed_dim, 2L - 1), lags -(L-1) .. L-1, for the encoder, with L the model's
  ``max_positions``), and transformed at run time, so one parameter serves every length up to L;
  a longer sequence raises ``ValueError``. Taps start as N(0, init_std^2) (GFNet's 0.02).
- Encoder (non-causal): padded positions are zeroed before the transform, and the convolution is
  linear over the real tokens (an FFT of size >= 2N), so padding, left or right, changes nothing.
- Decoder self-attention and language models (``causal=True``): a causal long convolution;
  incremental decoding keeps the (padding-zeroed) values of the positions so far and computes
  each new position by the direct sum over them, O(t d) per step, equal to the full forward.
- Cross-attention stays softmax (a filter cannot attend to another sequence): the module takes
  ``self_attention=True`` only. ``attn_mask``, ``add_bias_kv`` / ``add_zero_attn``,
  ``need_weights`` and ``before_softmax`` raise ``ValueError`` (no weights are formed).
- No q_proj / k_proj (the filter reads only the values); attention dropout is not applied.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor
from torch.nn import Parameter

from fourierformer_fairseq.modules.option_checks import check_positive
from fourierformer_fairseq.modules.projected_attention import ProjectedMultiheadAttention
from fourierformer_fairseq.ops.global_filter import global_filter, global_filter_step


class GlobalFilterMixer(ProjectedMultiheadAttention):
    """Global-filter token mixing at a self-attention site (GFNet, Rao et al. 2021).

    See the module docstring. Args beyond fairseq's ``MultiheadAttention`` (and ``causal`` / ``max_positions``, which the
    layer sets; max_positions is required):
        init_std: standard deviation of the filter's initial taps.
    """

    supports_attn_mask = False
    supports_bias_kv = False
    supports_need_weights = False
    uses_queries_keys = False
    own_incremental_state = True

    def __init__(self, embed_dim, num_heads, *args, init_std: float = 0.02, **kwargs):
        self.check_options(dict(init_std=init_std))
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        if not self.self_attention:
            raise ValueError("GlobalFilterMixer mixes the tokens of one sequence: it takes self_attention=True "
                             "(encoder-decoder attention stays softmax)")
        if self.max_positions is None or self.max_positions < 1:
            raise ValueError("GlobalFilterMixer needs max_positions (the longest sequence its filter serves)")
        self.init_std = float(init_std)
        self.causal_filter = self.causal  # the lags the filter has: fixed at construction
        L = self.max_positions
        taps = L if self.causal_filter else 2 * L - 1
        self.filter = Parameter(torch.randn(embed_dim, taps) * self.init_std)

    @classmethod
    def check_options(cls, options) -> None:
        """The one validation of the options (keyword -> value; None: the default); raises OptionError."""
        check_positive(options, "init_std")

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, causal={self.causal}, max_positions={self.max_positions}, "
                f"filter={tuple(self.filter.shape)}")

    def _channels(self, v: Tensor) -> Tensor:
        """(batch, heads, time, head_dim) -> (batch, channels, time)."""
        B, H, T, D = v.shape
        return v.permute(0, 1, 3, 2).reshape(B, H * D, T)

    def _heads(self, y: Tensor) -> Tensor:
        """(batch, channels, time) -> (batch, heads, time, head_dim)."""
        B, _, T = y.shape
        return y.view(B, self.num_heads, self.head_dim, T).permute(0, 1, 3, 2)

    def attend(self, q, k, v, *, key_padding_mask, attn_mask, causal, need_weights):
        if causal != self.causal_filter:  # e.g. the full-context call of an alignment model
            raise ValueError(f"GlobalFilterMixer was built with causal={self.causal_filter} (its filter's lags) "
                             f"and cannot run causal={causal}")
        y = global_filter(self._channels(v), self.filter, causal, key_padding_mask)
        return self._heads(y), None

    def attend_step(self, q, k, v: Tensor, key_padding_mask: Optional[Tensor],
                    saved_state: Dict[str, Optional[Tensor]]) -> Tensor:
        """New positions of causal decoding: the values so far are kept (zeroed where padded)."""
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask[:, -v.size(2):]  # a mask over the whole prefix: this step's part
            v = v.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        prev = saved_state.get("prefix_value")
        history = v if prev is None else torch.cat([prev, v], dim=2)
        saved_state["prefix_value"] = history
        y = global_filter_step(self._channels(history), self.filter, v.size(2))
        if key_padding_mask is not None:
            y = y.masked_fill(key_padding_mask.unsqueeze(1), 0.0)
        return self._heads(y)


__all__ = ["GlobalFilterMixer"]
