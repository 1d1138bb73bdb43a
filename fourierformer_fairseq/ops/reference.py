"""Pure-PyTorch reference of Fourier integral attention: the single source of truth.

    w_ij = prod_d phi(sinc(R_d (q_id - k_jd))),   out_i = sum_j w_ij v_j / sum_j w_ij

For non-negative phi the weights are computed in the log domain,
    S_ij = sum_d log phi(sinc(x_ijd)),   out_i = softmax_j(S_ij + mask_ij) V,
which never underflows and takes additive -inf masks as they are. For phi = x^p
with odd p the weights change sign, so the reference normalises them directly,
w_ij exp(mask_ij) / (sum_j w_ij exp(mask_ij) + eps) (sum_j w_ij can be ~0, which is why those
variants diverge in the paper); a row with no visible key gives 0 for every phi.

Every fused kernel is tested against this file. It materialises (B, H, N, M, D)
intermediates chunk by chunk, so it is meant for correctness, not speed.
"""
from __future__ import annotations

import math

import torch

from .inputs import AttentionInputs, causal_bias, prepare_inputs

_D_CHUNK = 16


# Below this |x|, sinc is its Taylor series (to x^12: the next term is below 5e-17 there).
_SINC_SERIES_BOUND = 0.5


def _sinc(x: torch.Tensor) -> torch.Tensor:
    """sin(x) / x with sinc(0) = 1 and accurate, finite gradients everywhere.

    Near 0 the quotient is accurate in value, but its autograd derivative,
    cos(x) / x - sin(x) / x^2, cancels (absolute error ~eps / |x|: in float32 a near
    duplicate key, |x| ~ 1e-5, got a derivative off by ~1e-2 where the truth is ~x / 3).
    The series differentiates without cancellation.
    """
    small = x.abs() < _SINC_SERIES_BOUND
    xs = torch.where(small, x, torch.zeros_like(x))
    z = xs * xs
    series = 1 + z * (-1 / 6 + z * (1 / 120 + z * (-1 / 5040 + z * (1 / 362880 + z * (-1 / 39916800 + z / 6227020800)))))
    safe_x = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, series, torch.sin(safe_x) / safe_x)


def _log_phi_sinc(x: torch.Tensor, phi: str, power: int) -> torch.Tensor:
    """log phi(sinc(x)) for the non-negative phis; where |sinc| is 0 it is clamped to log(tiny)
    (a far lower score than any other, with finite gradients). ReLU's zero weight where sinc < 0
    is exact: -inf (a key with such a factor takes no weight; a row of such keys gives 0, as a
    row with every key masked)."""
    s = _sinc(x)
    tiny = torch.finfo(x.dtype).tiny
    if phi == "power":  # even power: phi(s) = s^p = |s|^p
        return power * torch.log(s.abs().clamp_min(tiny))
    if phi == "abs":
        return torch.log(s.abs().clamp_min(tiny))
    if phi == "relu":
        log_abs = torch.log(s.abs().clamp_min(tiny))
        return log_abs.masked_fill(s.detach() < 0, float("-inf"))
    if phi == "sigmoid":
        return torch.nn.functional.logsigmoid(s)
    raise ValueError(phi)


def _scaled_differences(inp: AttentionInputs, d0: int, d1: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """x_ijd = R_hd (q_id - k_jd) for d in [d0, d1): (B, H, N, M, d1 - d0); 0 where ``hidden``
    (broadcasting to (B, H, N, M)) is True, so that a key's NaN reaches neither the scores of the
    rows that do not see it nor, through them, any gradient."""
    q = inp.q[..., d0:d1].unsqueeze(3)
    k = inp.k[..., d0:d1].unsqueeze(2)
    r = inp.radius_hd[:, d0:d1].to(inp.q.dtype).reshape(1, -1, 1, 1, d1 - d0)
    diff = q - k
    if hidden is not None:
        diff = diff.masked_fill(hidden.unsqueeze(-1), 0.0)
    return r * diff


def _hidden(inp: AttentionInputs, mask: torch.Tensor | None) -> torch.Tensor | None:
    """The masked (i, j) of a call whose q or k is not finite (else None: nothing to keep out)."""
    if mask is None or (bool(torch.isfinite(inp.q).all()) and bool(torch.isfinite(inp.k).all())):
        return None
    return mask == float("-inf")


def additive_mask(inp: AttentionInputs) -> torch.Tensor | None:
    """All masks summed into one additive tensor broadcastable to (B, H, N, M), or None."""
    B, H, N, _ = inp.q.shape
    M = inp.k.shape[2]
    total = None
    dtype = inp.q.dtype

    def add(t):
        nonlocal total
        if t.dtype == torch.bool:  # True = masked
            t = torch.zeros(t.shape, dtype=dtype, device=t.device).masked_fill(t, float("-inf"))
        t = t.to(dtype)
        total = t if total is None else total + t

    if inp.attn_mask is not None:
        add(inp.attn_mask)
    if inp.key_padding_mask is not None:
        add(inp.key_padding_mask.reshape(B, 1, 1, M))
    if inp.causal:
        add(causal_bias(N, M, inp.q.device).reshape(1, 1, N, M))
    return total


def log_weights(inp: AttentionInputs) -> torch.Tensor:
    """S_ij = sum_d log phi(sinc(x_ijd)) plus masks: (B, H, N, M). Log domain only."""
    D = inp.q.shape[-1]
    mask = additive_mask(inp)
    hidden = _hidden(inp, mask)
    S = None
    for d0 in range(0, D, _D_CHUNK):
        part = _log_phi_sinc(_scaled_differences(inp, d0, min(D, d0 + _D_CHUNK), hidden), inp.phi, inp.power).sum(-1)
        S = part if S is None else S + part
    if mask is None:
        return S
    # a masked key's score is never formed: -inf, whatever its key holds (a NaN included)
    return (S + mask).masked_fill(mask == float("-inf"), float("-inf"))


def masked_softmax(S: torch.Tensor, normaliser_eps: float = 0.0) -> torch.Tensor:
    """softmax over the last dim; rows that are entirely -inf give all-zero weights, not NaN.

    normaliser_eps > 0: exp(S_ij) / (sum_j exp(S_ij) + eps), a null key of score log(eps) whose
    weight is dropped (the published code's normaliser).
    """
    if normaliser_eps > 0:
        null = torch.full(S.shape[:-1] + (1,), math.log(normaliser_eps), dtype=S.dtype, device=S.device)
        return masked_softmax(torch.cat([S, null], -1))[..., :-1]
    row_max = S.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(S - row_max.detach())
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def _direct_weights(inp: AttentionInputs) -> torch.Tensor:
    """Signed weights normalised directly (odd powers): w_ij / (sum_j w_ij + eps), w_ij the product
    of the factors times exp(mask_ij) (0 where masked, as the log domain's S_ij + mask_ij); a row
    with no visible key gives 0, as every phi's does. The products are taken as they are, in the
    inputs' dtype: they can underflow where the fused kernels' log-magnitudes do not."""
    D = inp.q.shape[-1]
    mask = additive_mask(inp)
    hidden = _hidden(inp, mask)
    w = None
    for d0 in range(0, D, _D_CHUNK):
        part = (_sinc(_scaled_differences(inp, d0, min(D, d0 + _D_CHUNK), hidden)) ** inp.power).prod(-1)
        w = part if w is None else w * part
    if mask is None:
        return w / (w.sum(-1, keepdim=True) + inp.normaliser_eps)
    masked = (mask == float("-inf")).expand_as(w)
    w = torch.where(masked, torch.zeros_like(w), w * torch.exp(mask.masked_fill(mask == float("-inf"), 0.0)))
    total = w.sum(-1, keepdim=True) + inp.normaliser_eps
    seen = (~masked).any(-1, keepdim=True)
    return w / torch.where(seen, total, torch.ones_like(total))


def dropout_keep_mask(seed: int, shape, dropout_p: float, device) -> torch.Tensor:
    """The counter-based dropout mask every backend draws: True = keep.

    u_bhij = hash(seed, b*H + h, i, j) / 2^24 (24 random bits); keep where u >= dropout_p.
    Mirrors ``ff_dropout_uniform`` in csrc/fourier_element_math.h bit for bit.
    """
    B, H, N, M = shape
    mask32 = 0xFFFFFFFF

    def mix(x):
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & mask32
        x = x ^ (x >> 15)
        x = (x * 0x846CA68B) & mask32
        return x ^ (x >> 16)

    bh = torch.arange(B * H, device=device, dtype=torch.int64).reshape(B, H, 1, 1)
    i = torch.arange(N, device=device, dtype=torch.int64).reshape(1, 1, N, 1)
    j = torch.arange(M, device=device, dtype=torch.int64).reshape(1, 1, 1, M)
    x = (seed & mask32) ^ ((bh * 0x9E3779B1) & mask32)
    x = mix(x ^ ((i * 0x85EBCA77) & mask32))
    x = mix(x ^ ((j * 0xC2B2AE3D) & mask32))
    u = (x >> 8).to(torch.float64) * (1.0 / (1 << 24))
    return u >= dropout_p


def attention_weights(inp: AttentionInputs, seed: int = 0) -> torch.Tensor:
    """Normalised weights (B, H, N, M), after dropout when inp.dropout_p > 0."""
    P = masked_softmax(log_weights(inp), inp.normaliser_eps) if inp.log_domain else _direct_weights(inp)
    if inp.dropout_p > 0:
        keep = dropout_keep_mask(seed, P.shape, inp.dropout_p, P.device)
        P = P * keep.to(P.dtype) / (1.0 - inp.dropout_p)
    return P


def reference_from_inputs(inp: AttentionInputs, need_weights: bool = False, seed: int = 0):
    P = attention_weights(inp, seed)
    out = torch.matmul(P, inp.v)
    return (out, P) if need_weights else out


def fourier_attention_reference(
    q,
    k,
    v,
    radius,
    *,
    power=4,
    phi="power",
    attn_mask=None,
    key_padding_mask=None,
    causal=False,
    dropout_p=0.0,
    normaliser_eps=0.0,
    need_weights=False,
    seed=None,
    backend="reference",
):
    """Pure-PyTorch Fourier integral attention; same signature as ``fourier_attention``.

    ``seed`` fixes the dropout mask (``dropout_keep_mask``); by default one is drawn from
    torch's CPU generator, so ``torch.manual_seed`` makes runs repeatable.
    """
    if backend != "reference":
        raise ValueError("fourier_attention_reference only runs the 'reference' backend")
    inp = prepare_inputs(
        q, k, v, radius, power=power, phi=phi, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
        causal=causal, dropout_p=dropout_p, normaliser_eps=normaliser_eps,
    )
    if seed is None:
        seed = draw_seed() if inp.dropout_p > 0 else 0
    return reference_from_inputs(inp, need_weights, seed)


def draw_seed() -> int:
    return int(torch.randint(0, 2**31 - 1, (1,), dtype=torch.int64).item())
