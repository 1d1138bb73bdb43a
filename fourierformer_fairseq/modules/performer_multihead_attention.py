"""``PerformerMultiheadAttention``: fairseq's ``MultiheadAttention`` with random-feature attention.

FAVOR+ (Choromanski et al., "Rethinking Attention with Performers", ICLR 2021): softmax attention
``softmax(q k^T / sqrt(d)) v`` approximated in linear time through positive orthogonal random
features, computed by :mod:`fourierformer_fairseq.ops.favor`. Kernels:

- ``softmax`` (default): FAVOR+ positive features ``exp(w . x - |x|^2 / 2)``, ``x = q d^-1/4``
  (or ``k``), with the reference code's stabilisers (see ``ops.favor``);
- ``relu``: the generalised ReLU kernel;
- ``fourier_rf`` (experimental): a non-negative random-feature estimate of the Fourier integral
  kernel ``prod_d sinc^p(R (q_d - k_d))`` (even ``p``; learnable radius ``R`` of shape
  scalar / head / feature, as in ``FourierMultiheadAttention``).

A drop-in subclass, as ``FourierMultiheadAttention`` is: same constructor arguments and
``forward`` contract (self-attention, causal decoder self-attention, encoder-decoder attention,
``key_padding_mask``, ``incremental_state`` / ``static_kv`` caching that beam search reorders,
beamable encoder-decoder attention, ``need_weights`` / ``need_head_weights``), the inherited
projections (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) and cache helpers. Differences:

- Causal self-attention in incremental decoding keeps a constant-size cache: the running sums
  ``S = sum_j phi(k_j) [v_j, 1]^T`` (batch, heads, features, head_dim + 1) and the keys' running
  stabiliser (batch, heads), through ``_get_input_buffer`` / ``_set_input_buffer``, so
  ``reorder_incremental_state`` reorders them for beam search. Its ``need_weights`` gives None
  (the earlier keys are not kept). Encoder-decoder attention caches the projected keys and
  values in the stock layout.
- ``attn_mask`` must be None: causal self-attention is said with ``causal=True`` (set by the
  decoder layer; computed by prefix sums); masks cannot be applied to weights that are never
  formed and raise ``ValueError``.
  ``add_bias_kv``, ``add_zero_attn`` and ``before_softmax`` are not supported.
- Attention dropout is not applied (the weights are never formed); ``dropout > 0`` logs a warning.
- ``need_weights`` materialises the approximate weights ``phi(q_i) . phi(k_j)`` normalised over
  the keys (O(N M) memory, only when asked for).

The random projection ``projection`` (features x head_dim, float32, also after ``.half()``) is a
persistent buffer, saved in checkpoints with its seed and draw index. It is drawn from
``feature_seed(seed, "", draw)`` with its own ``torch.Generator`` (never torch's global one),
and redrawn in training every ``redraw_interval`` updates (``set_num_updates``, which fairseq's
trainer calls after every update): draw ``num_updates // redraw_interval``, identical on every
worker. It is never redrawn in evaluation.
"""
from __future__ import annotations

import logging
from typing import Dict, Optional

import torch
from torch import Tensor
from torch.nn import Parameter

from fourierformer_fairseq.modules.projected_attention import ProjectedMultiheadAttention
from fourierformer_fairseq.modules.option_checks import OptionError, check_choice, check_int, check_positive
from fourierformer_fairseq.ops.favor import (
    DEFAULT_CHUNK,
    FEATURE_TYPES,
    KERNELS,
    causal_chunks,
    compute_dtype,
    default_num_features,
    draw_projection,
    favor_attention,
    favor_weights,
    feature_seed,
    key_features,
    normalise,
    query_features,
    with_ones,
)
from fourierformer_fairseq.ops.inputs import RADIUS_SHAPES, radius_parameter_shape

logger = logging.getLogger(__name__)


class PerformerMultiheadAttention(ProjectedMultiheadAttention):
    """Multi-head random-feature attention (FAVOR+ and variants).

    Args beyond fairseq's ``MultiheadAttention``:
        num_features: random features m per head (0: ``round(d ln d)`` for softmax / relu, with
            d the head dim; 16 frequencies for fourier_rf, whose feature dimension is m (2m + 1)).
        kernel: "softmax", "relu" or "fourier_rf".
        redraw_interval: redraw the features every this many training updates (0: never).
        feature_type: "orthogonal" (default) or "iid" rows (softmax / relu).
        seed: seed of the feature draws (models set it from ``--seed`` and the module's name).
        power, radius_init, radius_shape: p and the learnable radius R of fourier_rf.
        chunk_size: positions per chunk of the causal prefix sums.
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        *args,  # fairseq's MultiheadAttention arguments (see ProjectedMultiheadAttention)
        num_features: int = 0,
        kernel: str = "softmax",
        redraw_interval: int = 0,
        feature_type: str = "orthogonal",
        seed: int = 0,
        power: int = 4,
        radius_init: float = 2.0,
        radius_shape: str = "scalar",
        chunk_size: int = DEFAULT_CHUNK,
        **kwargs,
    ):
        self.check_options(dict(num_features=num_features, kernel=kernel, redraw_interval=redraw_interval,
                                feature_type=feature_type, power=power, radius_init=radius_init,
                                radius_shape=radius_shape))
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        if self.dropout_module.p > 0:
            logger.warning("PerformerMultiheadAttention: attention dropout %s is not applied "
                           "(random-feature attention never forms the weights)", self.dropout_module.p)
        self.kernel = kernel
        self.num_features = int(num_features) or default_num_features(self.head_dim, kernel)
        self.redraw_interval = int(redraw_interval)
        self.feature_type = feature_type
        self.power = int(power)
        self.chunk_size = int(chunk_size)
        if kernel == "fourier_rf":
            self.radius_shape = radius_shape
            self.radius_init = float(radius_init)
            self.radius = Parameter(torch.full(radius_parameter_shape(radius_shape, num_heads, self.head_dim),
                                               float(radius_init)))
        else:
            self.radius = None
        # persistent state of the features: seed, draw index, the draw itself (no global RNG used)
        self.register_buffer("feature_seed", torch.tensor(int(seed), dtype=torch.long))
        self.register_buffer("feature_draw", torch.tensor(0, dtype=torch.long))
        self.register_buffer("projection", self._draw(int(seed), 0))

    @classmethod
    def check_options(cls, options) -> None:
        """The one validation of the options (keyword -> value; None: the default); raises OptionError."""
        check_choice(options, "kernel", KERNELS)
        check_choice(options, "feature_type", FEATURE_TYPES)
        check_int(options, "num_features", 0, "a non-negative integer (0: the default)")
        check_int(options, "redraw_interval", 0, "a non-negative integer (0: never)")
        check_positive(options, "radius_init")
        check_choice(options, "radius_shape", RADIUS_SHAPES)
        power = options.get("power")
        if options.get("kernel") == "fourier_rf" and power is not None and (
                isinstance(power, bool) or int(power) != power or power < 2 or power % 2):
            raise OptionError("{kernel} fourier_rf needs an even {power} >= 2, got {value!r}", value=power)

    def extra_repr(self) -> str:
        extra = f", power={self.power}, radius_shape={self.radius_shape!r}" if self.kernel == "fourier_rf" else ""
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kernel={self.kernel!r}, "
                f"num_features={self.num_features}, feature_type={self.feature_type!r}, "
                f"redraw_interval={self.redraw_interval}{extra}")

    # ------------------------------------------------------------------ features

    def _draw(self, seed: int, draw: int) -> Tensor:
        return draw_projection(self.kernel, self.num_features, self.head_dim, feature_seed(seed, "", draw),
                               power=self.power, feature_type=self.feature_type)

    @torch.no_grad()
    def redraw_features(self, draw: Optional[int] = None, seed: Optional[int] = None) -> None:
        """Replace the projection by draw ``draw`` (default: the current one) of ``seed`` (default: the module's)."""
        if seed is not None:
            self.feature_seed.fill_(int(seed))
        if draw is not None:
            self.feature_draw.fill_(int(draw))
        new = self._draw(int(self.feature_seed), int(self.feature_draw))
        self.projection.copy_(new.to(self.projection.device))

    def set_num_updates(self, num_updates: int) -> None:
        """Called by fairseq after every update: redraws in training when a new interval starts."""
        if not self.training or self.redraw_interval <= 0:
            return
        draw = int(num_updates) // self.redraw_interval
        if draw != int(self.feature_draw):
            self.redraw_features(draw)

    def _apply(self, fn, *args, **kwargs):
        # .half() / .to(dtype) move the projection but keep it float32 (the features are computed in float32)
        saved = self._buffers["projection"]
        result = super()._apply(fn, *args, **kwargs)
        moved = self._buffers["projection"]
        if moved is not None and moved.dtype != torch.float32:
            self._buffers["projection"] = saved.to(device=moved.device, dtype=torch.float32)
        return result

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "projection"
        if key in state_dict and state_dict[key].dtype != torch.float32:
            state_dict[key] = state_dict[key].float()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ------------------------------------------------------------------ attention

    supports_attn_mask = False  # the weights are never formed: only causal=True, by prefix sums
    supports_bias_kv = False
    own_incremental_state = True  # causal self-attention keeps the running sums, not the keys

    def attend(self, q, k, v, *, key_padding_mask, attn_mask, causal, need_weights):
        common = dict(kernel=self.kernel, key_padding_mask=key_padding_mask, causal=causal, radius=self.radius)
        out = favor_attention(q, k, v, self.projection, chunk=self.chunk_size, **common)
        weights = favor_weights(q, k, self.projection, **common).to(v.dtype) if need_weights else None
        return out, weights

    # ------------------------------------------------------------------ helpers

    def attend_step(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                    saved_state: Dict[str, Optional[Tensor]]) -> Tensor:
        """Causal self-attention over the cached prefix: S and the stabiliser C are all that is kept."""
        if key_padding_mask is not None and key_padding_mask.size(1) != k.size(2):
            key_padding_mask = key_padding_mask[:, -k.size(2):]  # a mask over the whole prefix: this step's part
        prev_kv = saved_state.get("prefix_kv")
        prev_c = saved_state.get("prefix_logscale")
        device_type = q.device.type if q.device.type in ("cuda", "cpu") else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            projection = self.projection.to(compute_dtype(q))
            qf = query_features(self.kernel, q, projection, self.radius)
            kf, logscale = key_features(self.kernel, k, projection, key_padding_mask, True, self.radius,
                                        prev_logscale=prev_c)
            v1 = with_ones(v.to(compute_dtype(q)))
            if prev_kv is None:
                state = (qf.new_zeros(qf.size(0), qf.size(1), qf.size(-1), v1.size(-1)), logscale[..., 0])
            else:
                state = (prev_kv, prev_c)
            num_den, (S, c) = causal_chunks(qf, kf, v1, logscale, self.chunk_size, state=state)
        saved_state["prefix_kv"] = S
        saved_state["prefix_logscale"] = c
        return normalise(num_den).to(v.dtype)


__all__ = ["PerformerMultiheadAttention"]
