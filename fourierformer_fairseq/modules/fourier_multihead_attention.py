"""``FourierMultiheadAttention``: fairseq's ``MultiheadAttention`` with Fourier integral attention.

A drop-in subclass: same constructor arguments, same ``forward`` contract (self-attention,
causal decoder self-attention, encoder-decoder attention, ``key_padding_mask``, additive
``attn_mask``, ``incremental_state`` / ``static_kv`` caching that beam search reorders,
``need_weights`` / ``need_head_weights``), same parameter names (``q_proj``, ``k_proj``,
``v_proj``, ``out_proj``, ``bias_k``, ``bias_v``) plus one learnable ``radius``.

Only scoring and normalisation change: instead of ``softmax(q k^T / sqrt(d))`` the weights
are ``prod_d phi(sinc(R_d (q_d - k_d)))`` normalised over the keys, computed by
:func:`fourierformer_fairseq.ops.fourier_attention`. Everything else is fairseq's:
the projections are the inherited modules, and the incremental cache goes through the
inherited ``_get_input_buffer`` / ``_set_input_buffer`` / ``_append_prev_key_padding_mask``
(so ``reorder_incremental_state`` reorders it for beam search), bias_k / bias_v through
``_add_bias`` and ``add_zero_attn`` through ``_append_zero_attn``. The cache has the
stock layout, ``prev_key`` / ``prev_value`` of shape (batch, heads, seq, head_dim).

Queries are not multiplied by ``head_dim ** -0.5``: the radius is the (learnable) scale. With
``qk_norm="rms"`` (the architectures' default) queries and keys are first divided by their RMS
over the head dim, so that the radius alone sets how far ``R (q_d - k_d)`` reaches into sinc;
``radius_init=None`` then starts it at :func:`auto_radius`. Why: docs/training-dynamics.md.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch.nn import Parameter

from fourierformer_fairseq.modules.interval_metrics import forget_unlogged
from fourierformer_fairseq.modules.projected_attention import ProjectedMultiheadAttention
from fourierformer_fairseq.modules.option_checks import (
    OptionError,
    check_choice,
    check_int,
    check_non_negative,
    check_positive,
)
from fourierformer_fairseq.ops import append_to_key_table, fourier_attention, key_table, key_table_keys
from fourierformer_fairseq.ops.gaussian import gaussian_attention, gaussian_log_weights
from fourierformer_fairseq.ops.inputs import (PHIS, RADIUS_SHAPES, non_negative_weights, prepare_inputs,
                                              radius_parameter_shape)
from fourierformer_fairseq.ops.reference import log_weights

QK_NORMS = ("rms", "none")
KERNELS = ("sinc", "gaussian")
QK_NORM_EPS = 1e-6


def auto_radius(power: int, head_dim: int) -> float:
    """The radius at which Fourier attention on unit-RMS q, k starts as peaked as softmax attention.

    For small x, p log|sinc x| = -p x^2 / 6 + O(x^4), so the log-weights are
    -(p R^2 / 6) |q - k|^2 + O(R^4): a Gaussian kernel whose scores vary across keys like
    (p R^2 / 3) q . k. Softmax attention scores q . k / sqrt(D); equal temperatures give
    R = sqrt(3 / (p sqrt(D))): 0.36 at D 128, p 2; 0.43 at D 64, p 2 and at D 16, p 4.
    """
    return math.sqrt(3.0 / (power * math.sqrt(head_dim)))


def _holds(table: Tensor, keys: Tensor) -> bool:
    """Whether keys (batch, heads, seq, head_dim) are the view of the table that holds them."""
    return (keys.data_ptr() == table.data_ptr() and keys.size(0) == table.size(0)
            and keys.stride() == key_table_keys(table, keys.size(2)).stride())


def rms_normalise(x: Tensor) -> Tensor:
    """x / sqrt(mean_d x_d^2 + eps) over the last dim (the head dim), in float32 or wider."""
    compute = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    # (one op, x * rsqrt(mean(x^2) + eps): incremental decoding calls it twice a step and layer)
    return torch.rms_norm(compute, (x.size(-1),), eps=QK_NORM_EPS).to(x.dtype)


def _sum_over_ranks(t: Tensor) -> Tensor:
    """t summed over fairseq's data-parallel ranks (one all-reduce; t itself outside distributed training)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return t
    from fairseq.distributed import utils as distributed_utils

    group = distributed_utils.get_data_parallel_group()
    if distributed_utils.get_world_size(group) == 1:
        return t
    return distributed_utils.all_reduce(t, group)


class FourierMultiheadAttention(ProjectedMultiheadAttention):
    """Multi-head Fourier integral attention (FourierFormer, Nguyen et al. 2022).

    Args beyond fairseq's ``MultiheadAttention``:
        power: p in phi(x) = x^p (phi="power"); every p runs on the fused kernels (odd p: signed weights).
        phi: "power", "abs", "relu" or "sigmoid".
        radius_init: initial value of every entry of the radius R; None: ``auto_radius(power, head_dim)``.
        radius_shape: "scalar" (one R per layer), "head" (one per head) or
            "feature" (one per head and feature).
        qk_norm: "rms" (divide q and k by their RMS over the head dim before scoring) or "none"
            (the paper's formulation).
        kernel: "sinc" (Fourier integral attention) or "gaussian" (the ablation
            exp(-(p R^2 / 6) sum_d (q_d - k_d)^2), the small-x limit of the same p and R).
        normaliser_eps: the published code's normaliser, out_i = sum_j w_ij v_j / (sum_j w_ij + eps):
            a null key of log-weight log(eps) and value 0 (0: exact normalisation; sinc kernel only).
        proj_init_std: initialise the q, k, v and output projection weights N(0, std) (the
            published code's 0.02) instead of fairseq's init; biases, if any, start at 0.
        log_interval: every this many training updates, log the radius and the mean attention
            entropy through fairseq's metrics, reduced over the data-parallel ranks (0: never; see
            ``_log_metrics``), and with normaliser_eps the mean share of a row's weight that goes
            to the null key.
        backend: passed to ``fourier_attention`` ("auto", "cpu", "cuda", "reference").
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        *args,  # fairseq's MultiheadAttention arguments (see ProjectedMultiheadAttention)
        power: int = 4,
        phi: str = "power",
        radius_init: Optional[float] = None,
        radius_shape: str = "scalar",
        qk_norm: str = "rms",
        kernel: str = "sinc",
        normaliser_eps: float = 0.0,
        proj_init_std: Optional[float] = None,
        log_interval: int = 0,
        backend: str = "auto",
        **kwargs,
    ):
        self.check_options(dict(power=power, phi=phi, radius_init=radius_init, radius_shape=radius_shape,
                                qk_norm=qk_norm, kernel=kernel, normaliser_eps=normaliser_eps,
                                proj_init_std=proj_init_std, log_interval=log_interval))
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        self.power = int(power)
        self.phi = phi
        self.radius_shape = radius_shape
        self.radius_init = auto_radius(self.power, self.head_dim) if radius_init is None else float(radius_init)
        self.qk_norm = qk_norm
        self.kernel = kernel
        self.normaliser_eps = float(normaliser_eps)
        self.proj_init_std = None if proj_init_std is None else float(proj_init_std)
        if self.proj_init_std is not None:
            for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
                torch.nn.init.normal_(proj.weight, mean=0.0, std=self.proj_init_std)
                if proj.bias is not None:
                    torch.nn.init.zeros_(proj.bias)
        self.backend = backend
        self.log_interval = int(log_interval)
        self.log_name = "attn"  # set by the models to the layer's place, e.g. "enc0", "dec3", "cross3"
        self._log_this_update = False
        shape = radius_parameter_shape(radius_shape, num_heads, self.head_dim)
        self.radius = Parameter(torch.full(shape, self.radius_init))

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, power={self.power}, phi={self.phi!r}, "
            f"radius_shape={self.radius_shape!r}, radius_init={self.radius_init:.4g}, qk_norm={self.qk_norm!r}, "
            f"kernel={self.kernel!r}" + (f", normaliser_eps={self.normaliser_eps:g}" if self.normaliser_eps else "")
        )

    @classmethod
    def check_options(cls, options) -> None:
        """The one validation of the options (keyword -> value; None: the default); raises OptionError."""
        check_int(options, "power", 1, "a positive integer")
        check_choice(options, "phi", PHIS)
        check_positive(options, "radius_init")
        check_choice(options, "radius_shape", RADIUS_SHAPES)
        check_choice(options, "qk_norm", QK_NORMS)
        check_choice(options, "kernel", KERNELS)
        check_non_negative(options, "normaliser_eps")
        check_positive(options, "proj_init_std")
        check_int(options, "log_interval", 0, "a non-negative integer")
        phi = options.get("phi") or "power"
        if options.get("kernel") == "gaussian" and phi != "power":
            raise OptionError("{kernel} gaussian is exp(-(p R^2 / 6) |q - k|^2) and takes {phi} power, got {value!r}",
                              value=phi)
        if options.get("kernel") == "gaussian" and float(options.get("normaliser_eps") or 0) > 0:
            raise OptionError("{normaliser_eps} is for the sinc kernel ({kernel} gaussian drops a per-row constant "
                              "of its scores, so a null key has no fixed weight there), got {value!r}",
                              value=options.get("normaliser_eps"))

    # ------------------------------------------------------------------ observability

    def set_num_updates(self, num_updates: int) -> None:
        """Called through the model by fairseq's task before every training pass (``update_num``: the
        updates done so far) and when a checkpoint is loaded."""
        self._log_this_update = self.log_interval > 0 and num_updates % self.log_interval == 0
        if self.log_interval > 0:  # the metrics of _log_metrics: on fairseq's lines of their intervals only
            forget_unlogged(("radius_", "entropy_", "nullkey_"))

    def _log_metrics(self, q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor], causal: bool) -> None:
        """The radius of this layer and the mean entropy of its attention rows, over every rank.

        Each training pass of a logged update measures the rows of its batch's first sequence that
        see a key; the sums (:meth:`_diagnostic_sums`) are added up over fairseq's data-parallel
        ranks (one all-reduce, as fairseq reduces its own statistics; every rank takes part, also
        one that runs fairseq's dummy batch, whose rows then count) and logged as
        ``radius_<layer>`` (the mean over the ranks), ``entropy_<site>`` (nats; the mean over
        the rows, weighted by them, so that fairseq averages it over the site's layers, the passes
        of --update-freq and its --log-interval as it averages the loss) and, with a null key,
        ``nullkey_<layer>`` (its mean share of a row's weight). With N ranks each taking one pass
        of an update, the logged values are those of one process taking the same N batches as
        --update-freq N passes (to the rounding of the weighted sums).
        """
        from fairseq.logging import metrics

        self._log_this_update = False  # re-armed by set_num_updates, which fairseq calls before every pass
        with torch.no_grad():
            radius, ranks, entropy, rows, null_share = _sum_over_ranks(
                self._diagnostic_sums(q, k, key_padding_mask, causal)).tolist()
        metrics.log_scalar(f"radius_{self.log_name}", radius / ranks, round=4)
        if rows > 0:
            site = self.log_name.rstrip("0123456789")
            metrics.log_scalar(f"entropy_{site}", entropy / rows, weight=rows, round=3)
            if self.normaliser_eps > 0:
                metrics.log_scalar(f"nullkey_{self.log_name}", null_share / rows, weight=rows, round=4)

    def _diagnostic_sums(self, q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor], causal: bool) -> Tensor:
        """This pass's sums, float64 on q's device: (mean radius, 1 (this rank), the rows' entropies in
        nats, the rows, the rows' null-key shares eps / (sum_j w_ij + eps)), over the rows of the
        batch's first sequence that see a key. With an odd power the weights change sign: rows have
        no entropy then, and only the radius is summed (no rows)."""
        if not non_negative_weights(self.phi, self.power):
            zero = torch.zeros((), dtype=torch.float64, device=q.device)
            return torch.stack([self.radius.detach().double().mean(), zero + 1, zero, zero, zero])
        kpm = None if key_padding_mask is None else key_padding_mask[:1]
        S = self._scores(q[:1].float(), k[:1].float(), k[:1].float(), kpm, None, causal)
        P = torch.softmax(S, dim=-1)
        seen = torch.isfinite(S).any(-1)
        H = -(P * torch.where(P > 0, P.log(), torch.zeros_like(P))).sum(-1)
        share = torch.zeros((), dtype=torch.float64, device=q.device)
        if self.normaliser_eps > 0:
            lse = torch.logsumexp(S.double(), dim=-1)[seen]
            share = torch.sigmoid(math.log(self.normaliser_eps) - lse).sum()
        return torch.stack([
            self.radius.detach().double().mean(),
            torch.ones((), dtype=torch.float64, device=q.device),
            H[seen].double().sum(),
            seen.sum().double(),
            share,
        ])

    # ------------------------------------------------------------------ attention

    supports_before_softmax = True

    def prepare_queries_keys(self, q, k):
        if self.qk_norm == "rms":
            # before the cache, so cached keys are stored normalised (the normalisation is per key)
            q = rms_normalise(q)
            k = None if k is None else rms_normalise(k)
        return q, k

    def cache_key_table(self, saved_state, prev_key, k, static_kv):
        """The CPU backend's key table of the cached keys (``ops.key_table``): built once for static
        keys (encoder-decoder attention); for growing keys (self-attention) the keys' one copy,
        extended in place by each step's keys (``ops.append_to_key_table``: a table of the least
        room when it has none left) and rebuilt from the keys only when the cache was not kept by
        it (another batch, or a state set from outside). It holds the keys alone, so the radius it
        is read under is the call's (the table cannot go stale when the radius changes). None for
        the Gaussian kernel, the reference backend, and keys the CPU backend does not take."""
        if self.kernel != "sinc" or self.backend == "reference":
            return None
        table = saved_state.get("prev_key_table")
        if static_kv:
            keys = prev_key if k is None else k
            if table is None or table.size(0) != keys.size(0) or table.size(-1) < keys.size(2):
                table = key_table(keys)
            return table
        assert k is not None
        if table is not None and prev_key is not None and _holds(table, prev_key):
            return append_to_key_table(table, prev_key.size(2), k)
        return key_table(k if prev_key is None else torch.cat([prev_key, k], dim=2))

    def key_table_keys(self, table, count):
        return key_table_keys(table, count)

    def attend(self, q, k, v, *, key_padding_mask, attn_mask, causal, need_weights, key_table=None):
        if self.training and self._log_this_update:
            self._log_metrics(q, k, key_padding_mask, causal)
        attention = fourier_attention if self.kernel == "sinc" else gaussian_attention
        result = attention(
            q,
            k,
            v,
            self.radius,
            power=self.power,
            phi=self.phi,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            causal=causal,
            dropout_p=self.attention_dropout_p(),
            need_weights=need_weights,
            backend=self.backend,
            normaliser_eps=self.normaliser_eps,
            **({} if self.kernel != "sinc" else {"key_table": key_table}),
        )
        return result if need_weights else (result, None)

    def scores_before_softmax(self, q, k, v, *, key_padding_mask, attn_mask, causal):
        """The log-weights sum_d log phi(sinc(R_d (q_d - k_d))) plus masks, and the values."""
        B, H, N, M = q.size(0), q.size(1), q.size(2), k.size(2)
        return self._scores(q, k, v, key_padding_mask, attn_mask, causal).reshape(B * H, N, M), v.reshape(B * H, M, -1)

    # ------------------------------------------------------------------ helpers

    def _scores(self, q, k, v, key_padding_mask, attn_mask, causal):
        """The log-weights (B, H, N, M) of this layer's kernel, masks included."""
        if q.size(0) != k.size(0):
            k = k.repeat_interleave(q.size(0) // k.size(0), dim=0)
            v = v.repeat_interleave(q.size(0) // v.size(0), dim=0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.repeat_interleave(q.size(0) // key_padding_mask.size(0), dim=0)
        inp = prepare_inputs(
            q, k, v, self.radius, power=self.power, phi=self.phi, attn_mask=attn_mask,
            key_padding_mask=key_padding_mask, causal=causal,
        )
        if self.kernel == "gaussian":
            return gaussian_log_weights(inp)
        if not inp.log_domain:
            raise ValueError(
                f"before_softmax=True needs non-negative weights (phi='power' with even power, or abs/relu/sigmoid); "
                f"got phi={self.phi!r}, power={self.power}"
            )
        return log_weights(inp)
