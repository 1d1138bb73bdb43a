"""Random-feature (linear-time) attention: FAVOR+ (Choromanski et al., ICLR 2021) and an
experimental random-feature approximation of the Fourier integral kernel.

Attention with a kernel ``K(q, k) ~= phi(q) . phi(k)`` is

    out_i = sum_j (phi(q_i) . phi(k_j)) v_j / sum_j (phi(q_i) . phi(k_j)),

computed as ``phi(q_i)^T (sum_j phi(k_j) v_j^T)`` over ``m`` features: O(N m d) time and no
N x M matrix. Feature maps (``x`` is a head's query or key row, ``W`` the (m, d) projection):

- ``softmax`` (FAVOR+): ``exp(W x' - |x'|^2 / 2) / sqrt(m)`` with ``x' = x d^-1/4``, an unbiased
  positive estimate of ``exp(q . k / sqrt(d))``. As in the reference code, a query's features
  are divided by their row maximum and keys' by a maximum over keys; these constants cancel in
  the normalisation. Keys use the maximum over all non-padded keys of the (batch, head) in
  non-causal attention, and in causal attention the running maximum over the keys up to each
  position (never a later one), carried through the prefix sums as a decay
  ``exp(C_j - C_i) <= 1`` (see :class:`CausalLinearAttention`).
- ``relu``: the generalised kernel ``relu(W x') / sqrt(m)`` (Performer-ReLU).
- ``fourier_rf``: see :func:`fourier_rf_features`.

All feature maps run in float32 (also under fp16 / bf16 autocast; float64 inputs stay float64)
and add ``eps`` to the softmax and ReLU features, as the reference code does; padded keys get
zero features, so they are removed from the numerator and the denominator.

Projections: :func:`gaussian_orthogonal_matrix` (blocks of ``d`` orthonormal rows from the QR
of Gaussian matrices, rows rescaled by chi-distributed norms, or plain iid Gaussian rows) and
:func:`fourier_rf_frequencies`; both draw from a ``torch.Generator`` seeded by
:func:`feature_seed` (a hash of a seed, a name and a draw index), never from torch's global
generator, so that every process draws the same features and nothing else's initialisation moves.
"""
from __future__ import annotations

import hashlib
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

KERNELS = ("softmax", "relu", "fourier_rf")
FEATURE_TYPES = ("orthogonal", "iid")
EPS = 1e-6
DEFAULT_CHUNK = 64
#: default number of random frequencies of ``fourier_rf`` (its feature dimension is m (2m + 1))
FOURIER_RF_DEFAULT_FREQUENCIES = 16
#: the large negative number that stands for "no key yet" in the causal key stabiliser
_NO_KEY = -1e30


def default_num_features(head_dim: int, kernel: str = "softmax") -> int:
    """``round(d ln d)`` random features for softmax / relu (the paper's choice), 16 frequencies for fourier_rf."""
    if kernel == "fourier_rf":
        return FOURIER_RF_DEFAULT_FREQUENCIES
    return max(1, int(round(head_dim * math.log(head_dim)))) if head_dim > 1 else 1


def feature_seed(seed: int, name: str = "", draw: int = 0) -> int:
    """A 63-bit seed from (seed, name, draw index): the same in every process and on every machine."""
    digest = hashlib.blake2b(f"{int(seed)}|{name}|{int(draw)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


# ----------------------------------------------------------------------------- projections


def gaussian_orthogonal_matrix(num_features: int, dim: int, generator: torch.Generator,
                               feature_type: str = "orthogonal") -> Tensor:
    """(m, d) float32 projection: rows w_r ~ N(0, I_d), block-orthogonal for ``feature_type="orthogonal"``.

    Orthogonal: ceil(m / d) independent blocks, each the Q of a QR decomposition of a d x d
    Gaussian matrix (signs fixed by diag(R), so that Q is Haar-distributed), rows multiplied by
    the norms of independent d-dimensional Gaussian vectors, so that every row is marginally
    N(0, I_d) while rows within a block are exactly orthogonal.
    """
    if feature_type not in FEATURE_TYPES:
        raise ValueError(f"feature_type must be one of {FEATURE_TYPES}, got {feature_type!r}")
    if feature_type == "iid":
        return torch.randn(num_features, dim, generator=generator, dtype=torch.float64).float()
    num_blocks = -(-num_features // dim)
    g = torch.randn(num_blocks, dim, dim, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)  # one batched decomposition
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    q = q * signs.masked_fill(signs == 0, 1.0).unsqueeze(-2)
    rows = q.transpose(-1, -2).reshape(num_blocks * dim, dim)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (rows * norms).float()


def _irwin_hall_inverse_cdf(u: Tensor, n: int) -> Tensor:
    """Quantiles of the sum of n independent U[0, 1] (the Irwin-Hall distribution), by bisection in float64."""
    if n == 1:
        return u
    if n == 2:  # triangular on [0, 2]: closed form
        return torch.where(u < 0.5, torch.sqrt(2 * u), 2 - torch.sqrt(2 * (1 - u)))

    def cdf(x):
        total = torch.zeros_like(x)
        for j in range(n + 1):
            total = total + (-1) ** j * math.comb(n, j) * torch.clamp(x - j, min=0) ** n
        return total / math.factorial(n)

    lo, hi = torch.zeros_like(u), torch.full_like(u, float(n))
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < u
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return 0.5 * (lo + hi)


def fourier_rf_frequencies(num_frequencies: int, dim: int, power: int, seed: int, sampling: str = "qmc") -> Tensor:
    """(m, d) float32 frequencies of the square root of the Fourier kernel, for radius 1.

    ``prod_d sinc^(p/2)(t_d) = E[cos(w . t)]`` with ``w_d`` distributed as the sum of ``p/2``
    independent U[-1, 1] (sinc is the characteristic function of U[-1, 1]). Each ``w_d`` is that
    distribution's quantile of one uniform ``u_d``; ``sampling="qmc"`` takes the ``u`` from a
    scrambled Sobol sequence in d dimensions (every coordinate of the first m points stratified:
    one point in each of m equal intervals when m is a power of two), ``"iid"`` from plain uniforms.
    """
    if power % 2:
        raise ValueError(f"fourier_rf needs an even power (the kernel is estimated as a square), got {power}")
    half = power // 2
    if sampling == "qmc":
        engine = torch.quasirandom.SobolEngine(dim, scramble=True, seed=seed % (2 ** 31))
        u = engine.draw(num_frequencies, dtype=torch.float64)
    elif sampling == "iid":
        u = torch.rand(num_frequencies, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    else:
        raise ValueError(f"sampling must be 'qmc' or 'iid', got {sampling!r}")
    return (2.0 * _irwin_hall_inverse_cdf(u, half) - half).float()


def draw_projection(kernel: str, num_features: int, head_dim: int, seed: int, *, power: int = 4,
                    feature_type: str = "orthogonal", sampling: str = "qmc") -> Tensor:
    """The (m, d) projection of ``kernel`` for one seed (see :func:`feature_seed`)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "fourier_rf":
        return fourier_rf_frequencies(num_features, head_dim, power, seed, sampling=sampling)
    return gaussian_orthogonal_matrix(num_features, head_dim, torch.Generator().manual_seed(seed), feature_type)


# ----------------------------------------------------------------------------- feature maps


def compute_dtype(x: Tensor) -> torch.dtype:
    """float64 stays float64 (for exact checks); everything else is computed in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _scaled(x: Tensor) -> Tensor:
    return x.to(compute_dtype(x)) * (x.size(-1) ** -0.25)


def softmax_query_features(q: Tensor, projection: Tensor, eps: float = EPS) -> Tensor:
    """FAVOR+ query features exp(w.q' - |q'|^2/2 - max_r w_r.q') / sqrt(m) + eps (row max: cancels)."""
    x = _scaled(q)
    logits = x @ projection.t() - 0.5 * x.square().sum(-1, keepdim=True)
    logits = logits - logits.amax(-1, keepdim=True).detach()
    return (torch.exp(logits) + eps) * projection.size(0) ** -0.5


def softmax_key_logits(k: Tensor, projection: Tensor) -> Tensor:
    """log of the unstabilised FAVOR+ key features (B, H, M, m): w.k' - |k'|^2 / 2."""
    x = _scaled(k)
    return x @ projection.t() - 0.5 * x.square().sum(-1, keepdim=True)


def relu_features(x: Tensor, projection: Tensor, eps: float = EPS) -> Tensor:
    """Generalised (ReLU) kernel features relu(w.x') / sqrt(m) + eps."""
    return (torch.relu(_scaled(x) @ projection.t()) + eps) * projection.size(0) ** -0.5


def trig_softmax_features(x: Tensor, projection: Tensor) -> Tensor:
    """Trigonometric features of exp(q . k / sqrt(d)) (for comparison only: signed, not stabilised).

    exp(x.y) = exp(|x|^2/2) exp(|y|^2/2) exp(-|x - y|^2/2), the last factor by random Fourier
    features [cos(W x), sin(W x)] / sqrt(m).
    """
    x = _scaled(x)
    proj = x @ projection.t()
    scale = torch.exp(0.5 * x.square().sum(-1, keepdim=True)) * projection.size(0) ** -0.5
    return torch.cat([torch.cos(proj), torch.sin(proj)], -1) * scale


def _radius_view(radius: Tensor, x: Tensor) -> Tensor:
    """A scalar, (H, 1), (D,) or (H, D) radius, shaped to broadcast against x (B, H, N, D)."""
    if radius.dim() == 2:
        return radius.reshape(1, radius.size(0), 1, radius.size(1)).to(compute_dtype(x))
    return radius.to(compute_dtype(x))


def fourier_rf_features(x: Tensor, frequencies: Tensor, radius: Tensor) -> Tensor:
    """Non-negative random-feature estimate of the Fourier kernel prod_d sinc^p(R (q_d - k_d)) (even p).

    With ``h(t) = prod_d sinc^(p/2)(R t_d) = E[cos(R w . t)]`` (frequencies ``w`` from
    :func:`fourier_rf_frequencies`), ``f(x) = [cos(R W x), sin(R W x)] / sqrt(m)`` gives the
    unbiased estimate ``f(q) . f(k) = mean_r cos(R w_r . (q - k))`` of ``h``. The kernel is
    ``h^2``, estimated by ``(f(q) . f(k))^2 = g(q) . g(k)`` with
    ``g(x) = [f_a(x)^2, sqrt(2) f_a(x) f_b(x) (a < b)]`` (dimension m (2m + 1)): never negative,
    so every normaliser is a sum of non-negative terms and every output a convex combination of
    the values. Its bias is the variance of the ``h`` estimate (at most 1/(2m) + h(2t)/(2m)),
    lowered by the stratified (QMC) frequencies where the kernel varies slowly.
    """
    proj = (x.to(compute_dtype(x)) * _radius_view(radius, x)) @ frequencies.to(compute_dtype(x)).t()
    f = torch.cat([torch.cos(proj), torch.sin(proj)], -1) * frequencies.size(0) ** -0.5
    n = f.size(-1)
    rows, cols = torch.triu_indices(n, n, device=f.device)
    weight = torch.where(rows == cols, 1.0, math.sqrt(2.0)).to(f.dtype)
    return f[..., rows] * f[..., cols] * weight


# ----------------------------------------------------------------------------- causal prefix sums


def _advance(S: Tensor, c_prev: Tensor, k_c: Tensor, v_c: Tensor, c: Tensor) -> Tensor:
    """The prefix state after one chunk, relative to the chunk's last log-scale (every decay <= 1)."""
    c_last = c[..., -1:]
    decayed_keys = k_c * torch.exp(c - c_last).unsqueeze(-1)
    return torch.exp(c_prev - c_last).unsqueeze(-1) * S + decayed_keys.transpose(-1, -2) @ v_c


def causal_chunks(qf: Tensor, kf: Tensor, v: Tensor, logscale: Tensor, chunk: int,
                   state: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
    """Y_i = sum_{j <= i} exp(C_j - C_i) (qf_i . kf_j) v_j, chunk by chunk; C non-decreasing along N.

    ``state`` = (S, C_prev): S (B, H, m, dv) the sum over earlier positions relative to C_prev (B, H).
    Returns Y and the final state.
    """
    B, H, N, m = qf.shape
    dv = v.size(-1)
    if state is None:
        S = qf.new_zeros(B, H, m, dv)
        c_prev = logscale[..., :1].clone() if N else qf.new_zeros(B, H, 1)
    else:
        S, c_prev = state
        c_prev = c_prev.unsqueeze(-1)
    outs = []
    for s in range(0, N, chunk):
        e = min(N, s + chunk)
        q_c, k_c, v_c, c = qf[..., s:e, :], kf[..., s:e, :], v[..., s:e, :], logscale[..., s:e]
        decay = torch.exp((c.unsqueeze(-2) - c.unsqueeze(-1)).clamp(max=0.0)).tril()  # [i, j] = exp(C_j - C_i), j <= i
        y = ((q_c @ k_c.transpose(-1, -2)) * decay) @ v_c
        y = y + torch.exp(c_prev - c).unsqueeze(-1) * (q_c @ S)
        outs.append(y)
        S = _advance(S, c_prev, k_c, v_c, c)
        c_prev = c[..., -1:]
    out = torch.cat(outs, -2) if outs else v.new_zeros(B, H, 0, dv)
    return out, (S, c_prev.squeeze(-1))


class CausalLinearAttention(torch.autograd.Function):
    """Y_i = sum_{j <= i} exp(C_j - C_i) (qf_i . kf_j) v_j by chunked prefix sums, O(m dv) state.

    ``logscale`` C (B, H, N) must be non-decreasing along N (the keys' running stabiliser; zeros
    for none) and gets no gradient. Forward keeps only its inputs; the backward runs the chunks
    again: forward with the prefix state S for d qf, backward with the suffix state
    R = sum_{i >= j} exp(C_j - C_i) qf_i g_i^T for d kf and d v (what the reference code's custom
    gradient does), so memory is O(B H (chunk^2 + m dv)) beyond the inputs, never N x m x dv.
    """

    @staticmethod
    def forward(ctx, qf, kf, v, logscale, chunk=DEFAULT_CHUNK):
        ctx.save_for_backward(qf, kf, v, logscale)
        ctx.chunk = chunk
        out, _ = causal_chunks(qf, kf, v, logscale, chunk)
        return out

    @staticmethod
    def backward(ctx, grad):
        qf, kf, v, logscale = ctx.saved_tensors
        chunk = ctx.chunk
        B, H, N, m = qf.shape
        dv = v.size(-1)
        grad = grad.contiguous()
        dq = torch.empty_like(qf)
        dk = torch.empty_like(kf)
        dvv = torch.empty_like(v)
        # forward sweep: d qf_i = sum_{j <= i} exp(C_j - C_i) (g_i . v_j) kf_j
        S = qf.new_zeros(B, H, m, dv)
        c_prev = logscale[..., :1]
        for s in range(0, N, chunk):
            e = min(N, s + chunk)
            k_c, v_c, g_c, c = kf[..., s:e, :], v[..., s:e, :], grad[..., s:e, :], logscale[..., s:e]
            decay = torch.exp((c.unsqueeze(-2) - c.unsqueeze(-1)).clamp(max=0.0)).tril()
            dq[..., s:e, :] = ((g_c @ v_c.transpose(-1, -2)) * decay) @ k_c + \
                torch.exp(c_prev - c).unsqueeze(-1) * (g_c @ S.transpose(-1, -2))
            S = _advance(S, c_prev, k_c, v_c, c)
            c_prev = c[..., -1:]
        # backward sweep: R (m, dv) = sum over later positions i of exp(C_next - C_i) qf_i g_i^T
        R = qf.new_zeros(B, H, m, dv)
        starts = list(range(0, N, chunk))
        c_next = logscale[..., -1:] if N else None
        for s in reversed(starts):
            e = min(N, s + chunk)
            q_c, k_c, v_c, g_c = qf[..., s:e, :], kf[..., s:e, :], v[..., s:e, :], grad[..., s:e, :]
            c = logscale[..., s:e]
            decay = torch.exp((c.unsqueeze(-2) - c.unsqueeze(-1)).clamp(max=0.0)).tril()  # [i, j]
            to_next = torch.exp(c - c_next).unsqueeze(-1)  # exp(C_j - C_next) <= 1
            a_gv = (g_c @ v_c.transpose(-1, -2)) * decay  # [i, j] = decay (g_i . v_j)
            a_qk = (q_c @ k_c.transpose(-1, -2)) * decay  # [i, j] = decay (qf_i . kf_j)
            dk[..., s:e, :] = a_gv.transpose(-1, -2) @ q_c + to_next * (v_c @ R.transpose(-1, -2))
            dvv[..., s:e, :] = a_qk.transpose(-1, -2) @ g_c + to_next * (k_c @ R)
            c_first = c[..., :1]
            R = torch.exp(c_first - c_next).unsqueeze(-1) * R + \
                (q_c * torch.exp(c_first - c).unsqueeze(-1)).transpose(-1, -2) @ g_c
            c_next = c_first
        return dq, dk, dvv, None, None


def causal_linear_attention(qf: Tensor, kf: Tensor, v: Tensor, logscale: Optional[Tensor] = None,
                            chunk: int = DEFAULT_CHUNK) -> Tensor:
    """Y_i = sum_{j <= i} exp(C_j - C_i) (qf_i . kf_j) v_j (C = 0 when ``logscale`` is None)."""
    if logscale is None:
        logscale = qf.new_zeros(qf.shape[:-1])
    return CausalLinearAttention.apply(qf, kf, v, logscale.detach(), chunk)


# ----------------------------------------------------------------------------- attention


def key_features(kernel: str, k: Tensor, projection: Tensor, key_padding_mask: Optional[Tensor], causal: bool,
                 radius: Optional[Tensor] = None, prev_logscale: Optional[Tensor] = None,
                 eps: float = EPS) -> Tuple[Tensor, Optional[Tensor]]:
    """Key features (B, H, M, F) with padded keys zeroed, and the causal log-scale C (B, H, M) or None.

    softmax: non-causal keys are divided by exp(max over the non-padded keys and features of
    their log-features) (one constant per batch and head); causal keys by exp(C_j), C_j the
    running maximum up to key j (starting from ``prev_logscale`` when continuing a prefix).
    """
    keep = None
    if key_padding_mask is not None:
        keep = ~key_padding_mask.view(key_padding_mask.size(0), 1, key_padding_mask.size(1), 1)
    logscale = None
    if kernel == "softmax":
        logits = softmax_key_logits(k, projection)
        if keep is not None:
            # padded keys: exp(-inf) = 0 whatever the stabiliser (no inf * 0 below)
            logits = logits.masked_fill(~keep, float("-inf"))
        row_max = logits.detach().amax(-1).clamp_min(_NO_KEY)
        if causal:
            logscale = torch.cummax(row_max, dim=-1).values
            if prev_logscale is not None:
                logscale = torch.maximum(logscale, prev_logscale.unsqueeze(-1))
            feats = torch.exp(logits - logscale.unsqueeze(-1))
        else:
            feats = torch.exp(logits - row_max.amax(-1, keepdim=True).unsqueeze(-1))
        feats = (feats + eps) * projection.size(0) ** -0.5
    elif kernel == "relu":
        feats = relu_features(k, projection, eps)
    elif kernel == "fourier_rf":
        assert radius is not None
        feats = fourier_rf_features(k, projection, radius)
    else:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if causal and logscale is None:
        logscale = feats.new_zeros(feats.shape[:-1]) if prev_logscale is None else \
            prev_logscale.unsqueeze(-1).expand(feats.shape[:-1]).clone()
    if keep is not None:
        feats = feats * keep
    return feats, logscale


def query_features(kernel: str, q: Tensor, projection: Tensor, radius: Optional[Tensor] = None,
                   eps: float = EPS) -> Tensor:
    if kernel == "softmax":
        return softmax_query_features(q, projection, eps)
    if kernel == "relu":
        return relu_features(q, projection, eps)
    if kernel == "fourier_rf":
        assert radius is not None
        return fourier_rf_features(q, projection, radius)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def normalise(num_den: Tensor) -> Tensor:
    """(..., dv + 1) numerator and denominator -> the output; rows with a zero denominator give 0."""
    num, den = num_den[..., :-1], num_den[..., -1:]
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def with_ones(v: Tensor) -> Tensor:
    return torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], -1)


def favor_attention(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, *, kernel: str = "softmax",
                    key_padding_mask: Optional[Tensor] = None, causal: bool = False,
                    radius: Optional[Tensor] = None, chunk: int = DEFAULT_CHUNK, eps: float = EPS) -> Tensor:
    """Random-feature attention: q (B, H, N, D), k (B, H, M, D), v (B, H, M, Dv) -> (B, H, N, Dv).

    ``key_padding_mask`` bool (B, M), True = padding. ``causal``: key j visible to query i for
    j <= i + M - N. Computed in float32 (autocast off), returned in v's dtype.
    """
    out_dtype = v.dtype
    device_type = q.device.type if q.device.type in ("cuda", "cpu") else "cpu"
    with torch.autocast(device_type=device_type, enabled=False):
        projection = projection.to(compute_dtype(q))
        qf = query_features(kernel, q, projection, radius, eps)
        kf, logscale = key_features(kernel, k, projection, key_padding_mask, causal, radius, eps=eps)
        v1 = with_ones(v.to(compute_dtype(q)))
        if causal:
            N, M = q.size(-2), k.size(-2)
            if N != M:
                raise ValueError(f"causal random-feature attention takes as many queries as keys, got {N} and {M}")
            num_den = causal_linear_attention(qf, kf, v1, logscale, chunk)
        else:
            kv = kf.transpose(-1, -2) @ v1  # (B, H, F, Dv + 1)
            num_den = qf @ kv
        return normalise(num_den).to(out_dtype)


def favor_weights(q: Tensor, k: Tensor, projection: Tensor, *, kernel: str = "softmax",
                  key_padding_mask: Optional[Tensor] = None, causal: bool = False,
                  radius: Optional[Tensor] = None, eps: float = EPS) -> Tensor:
    """The normalised approximate weights (B, H, N, M) that ``favor_attention`` applies (materialised)."""
    with torch.autocast(device_type=q.device.type if q.device.type in ("cuda", "cpu") else "cpu", enabled=False):
        projection = projection.to(compute_dtype(q))
        qf = query_features(kernel, q, projection, radius, eps)
        kf, logscale = key_features(kernel, k, projection, key_padding_mask, causal, radius, eps=eps)
        a = qf @ kf.transpose(-1, -2)
        if causal:
            N, M = a.shape[-2:]
            decay = torch.exp((logscale.unsqueeze(-2) - logscale[..., M - N:].unsqueeze(-1)).clamp(max=0.0))
            a = (a * decay).tril(M - N)
        den = a.sum(-1, keepdim=True)
        return torch.where(den > 0, a / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(a))


__all__ = [
    "CausalLinearAttention",
    "FEATURE_TYPES",
    "KERNELS",
    "causal_linear_attention",
    "default_num_features",
    "draw_projection",
    "favor_attention",
    "favor_weights",
    "feature_seed",
    "fourier_rf_features",
    "fourier_rf_frequencies",
    "gaussian_orthogonal_matrix",
    "key_features",
    "query_features",
    "relu_features",
    "softmax_key_logits",
    "softmax_query_features",
    "trig_softmax_features",
]
