"""An independent float64 oracle of Fourier integral attention, written from the formula alone.

    w_ij  = prod_d sinc(R_d (q_id - k_jd))^p          (p even)
    S_ij  = p * sum_d log|sinc(R_d (q_id - k_jd))| + mask_ij
    out_i = sum_j softmax_j(S_ij) v_j                 (a row with every key masked gives 0)

The other phis of the paper's Table 7 that are non-negative (keyword ``phi``, default "power"):
``phi="abs"``, w_ij = prod_d |sinc(x_ijd)|, is the formula above with p = 1 (``power`` is then
ignored); ``phi="relu"``, w_ij = prod_d max(sinc(x_ijd), 0), is |x|'s formula with the score -inf
(a zero weight) wherever a factor's sinc is negative (sin(x) x < 0, decided in the dtype computed
in); a row whose every visible key has a zero weight gives 0, as a row with every key masked;
``phi="sigmoid"``, w_ij = prod_d sigmoid(sinc(x_ijd)), has the score S_ij = sum_d log sigmoid(sinc
x_ijd) (torch's logsigmoid of sin(x) / x, its series 1 - x^2/6 + x^4/120 below |x| = 1e-3).

and with ``normaliser_eps`` = eps > 0 (the published code's normaliser) out_i = sum_j w_ij v_j /
(sum_j w_ij + eps): eps is the weight of one more key, of log-weight log(eps) and value 0.

Odd p (phi="power"): the weights w_ij = prod_d sinc(x_ijd)^p exp(mask_ij) keep their sign, the sign
of the product (sin(x) x < 0 in an odd number of features), and are normalised directly, P_ij =
w_ij / (sum_j w_ij + eps), whatever the sum's sign; a row with no visible key gives 0. Computed as
sign_ij exp(S_ij - m_i) / (sum_j sign_ij exp(S_ij - m_i) + eps exp(-m_i)), m_i the row's largest
score, so that nothing underflows.

It imports nothing from ``fourierformer_fairseq`` (not the reference, not the kernels), so
that tests of either can use it as the ground truth. Gradients come from autograd.

API (q (B, H, N, D), k (B, H, M, D), v (B, H, M, Dv); radius a scalar, (H, 1), (D,) or (H, D)):

    oracle_attention(q, k, v, radius, power=4, attn_mask=None, key_padding_mask=None, causal=False)
        -> out (B, H, N, Dv), float64, differentiable w.r.t. every input that requires grad.
           For float64 gradients pass float64 leaves (or use ``oracle_gradients``).
           ``dropout_scale`` (B, H, N, M), optional: dropout's factor f_ij of each normalised
           weight (0 where dropped, 1 / (1 - p) where kept; the test draws the kernels' mask),
           out_i = sum_j P_ij f_ij v_j (also in plain_attention and oracle_gradient_scales).
    oracle_weights(...same arguments but v...) -> normalised weights (B, H, N, M), float64.
    oracle_gradients(q, k, v, radius, grad_out, **same keywords)
        -> (out, dq, dk, dv, dradius): all float64, computed on float64 copies of the inputs.

    oracle_gradient_scales(q, k, v, radius, grad_out, **same keywords)
        -> (out, dq, dk, dv, dradius) scales, floats: the largest sum of the absolute values of
           the terms each element of that tensor sums (e.g. dq_id = sum_j p R_d P_ij (dP_ij -
           Delta_i) g(x_ijd) gives p |R_d| sum_j P_ij (|dP_ij| + |Delta_i|) |g(x_ijd)|). Rounding
           each term to a relative eps bounds an element's error by about eps times this, even
           where the terms cancel and the exact gradient is far smaller.

    lse_mismatches(lse, q, k, radius, **same keywords) -> list of strings: the kernels' log-
        normaliser against the oracle's log-sum over the visible keys, with a float32 bound.

    oracle_mismatches(ours, q, k, v, radius, grad_out, **same keywords) -> list of strings
        (empty when every one of ours = (out, dq, dk, dv, dradius) is within the bound
        ``max |ours - oracle| <= 4 max |plain - oracle| + 16 eps32 scale + 1e-30`` (with
        normaliser_eps, + p D eps32 scale: see oracle_mismatches): flash-
        attention's rule against a plain float32 implementation (series=True by default: with
        the series of log|sinc| near 0, see plain_gradients), plus a few float32 eps of the
        scale, where terms cancel and the plain one can be exact by luck, e.g. a weight of
        exactly 1, plus float32's underflow; see tests/ops/test_op_fuzz.py).

    plain_attention / plain_gradients / plain_weights: the same formula in the inputs' own dtype (float32
    for float32 inputs), written the plain way: log(abs(sin(x) / x)) (sinc(0) = 1), a
    max-subtracted softmax, autograd through it; with series=True, log|sinc| takes the
    oracle's series below |x| = 1e-3, in that dtype (a derivative that does not cancel near
    0). Tests derive their tolerances from its error against the oracle (flash-attention's
    rule: a kernel's error against the float64 oracle is at most a few times the error of a
    plain same-precision implementation).

Masks: ``attn_mask`` additive float ((N, M), (B*H, N, M) or (B|1, H|1, N, M)) or bool (True =
may not attend); ``key_padding_mask`` bool (B, M), True = padding; ``causal``: key j is
visible to query i iff j <= i + (M - N) (with N < M the queries are the last N positions).

The oracle's log|sinc x| uses its Taylor series -x^2/6 - x^4/180 - x^6/2835 - x^8/37800 below
|x| = 1e-3 (where the next term is below 1e-26): the plain quotient is accurate in value there
but its autograd derivative, cos(x)/x - sin(x)/x^2, cancels (absolute error ~eps/|x|).
"""
from __future__ import annotations

import torch

_SERIES_BOUND = 1e-3


def _radius_table(radius: torch.Tensor, H: int, D: int) -> torch.Tensor:
    """radius as (H, D), differentiable."""
    shape = tuple(radius.shape)
    if shape in ((), (1,), (1, 1)):
        return radius.reshape(1, 1).expand(H, D)
    if shape == (H, 1):
        return radius.expand(H, D)
    if shape in ((D,), (1, D)):
        return radius.reshape(1, D).expand(H, D)
    if shape == (H, D):
        return radius
    raise ValueError(f"radius shape {shape} is not a scalar, (H, 1), (D,) or (H, D) with H={H}, D={D}")


def additive_mask(B: int, H: int, N: int, M: int, attn_mask=None, key_padding_mask=None, causal=False,
                  dtype=torch.float64) -> torch.Tensor:
    """Every mask as one additive (B, H, N, M) tensor of 0 / -inf / finite values."""
    total = torch.zeros(B, H, N, M, dtype=dtype)
    if attn_mask is not None:
        m = attn_mask
        if m.dtype == torch.bool:
            m = torch.zeros(m.shape, dtype=dtype).masked_fill(m, float("-inf"))
        m = m.to(dtype)
        if m.dim() == 2:
            m = m.reshape(1, 1, N, M)
        elif m.dim() == 3:
            m = m.reshape(B, H, N, M)
        total = total + m
    if key_padding_mask is not None:
        pad = key_padding_mask.bool().reshape(B, 1, 1, M)
        total = total.masked_fill(pad, float("-inf"))
    if causal:
        i = torch.arange(N).reshape(N, 1) + (M - N)
        j = torch.arange(M).reshape(1, M)
        total = total.masked_fill((j > i).reshape(1, 1, N, M), float("-inf"))
    return total


def _log_abs_sinc_oracle(x: torch.Tensor) -> torch.Tensor:
    small = x.abs() < _SERIES_BOUND
    xs = torch.where(small, x, torch.zeros_like(x))
    x2 = xs * xs
    series = -x2 * (1.0 / 6 + x2 * (1.0 / 180 + x2 * (1.0 / 2835 + x2 * (1.0 / 37800))))
    xl = torch.where(small, torch.ones_like(x), x)
    direct = torch.log(torch.abs(torch.sin(xl) / xl))
    return torch.where(small, series, direct)


def _log_abs_sinc_plain(x: torch.Tensor) -> torch.Tensor:
    zero = x == 0
    xl = torch.where(zero, torch.ones_like(x), x)
    return torch.where(zero, torch.zeros_like(x), torch.log(torch.abs(torch.sin(xl) / xl)))


PHIS = ("power", "abs", "relu", "sigmoid")


def _sinc_oracle(x: torch.Tensor) -> torch.Tensor:
    small = x.abs() < _SERIES_BOUND
    xs = torch.where(small, x, torch.zeros_like(x))
    x2 = xs * xs
    xl = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, 1 - x2 / 6 + x2 * x2 / 120, torch.sin(xl) / xl)


def _sinc_plain(x: torch.Tensor) -> torch.Tensor:
    zero = x == 0
    xl = torch.where(zero, torch.ones_like(x), x)
    return torch.where(zero, torch.ones_like(x), torch.sin(xl) / xl)


def signed_weights(phi: str, power) -> bool:
    """Whether phi's weights change sign: x^p with odd p."""
    return phi == "power" and int(power) % 2 == 1


def _negative_products(q, k, radius, visible=None, d_chunk=32):
    """(B, H, N, M) bool: whether prod_d sinc(R_d (q_id - k_jd)) is negative (an odd number of
    features with sin(x) x < 0); False where ``visible`` is False."""
    B, H, N, D = q.shape
    R = _radius_table(radius, H, D).to(q.dtype).detach()
    negative = torch.zeros(B, H, N, k.shape[2], dtype=torch.bool)
    for d0 in range(0, D, d_chunk):
        d1 = min(D, d0 + d_chunk)
        x = R[:, d0:d1].reshape(1, H, 1, 1, d1 - d0) * (q[..., d0:d1].detach().unsqueeze(3)
                                                        - k[..., d0:d1].detach().unsqueeze(2))
        negative ^= ((torch.sin(x) * x < 0).sum(-1) % 2).bool()
    return negative if visible is None else negative & visible


def _signed_normalised(S, negative, visible, normaliser_eps):
    """sign e^(S - m) / (sum_j sign e^(S - m) + eps e^-m) per row (m its largest S); 0 for a row
    with no visible key."""
    m = S.amax(-1, keepdim=True) if S.shape[-1] > 0 else S.new_full(S.shape[:-1] + (1,), float("-inf"))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(S - m)
    e = torch.where(negative, -e, e)
    total = e.sum(-1, keepdim=True)
    if normaliser_eps > 0:
        total = total + normaliser_eps * torch.exp(-m)
    seen = visible.any(-1, keepdim=True)
    return e / torch.where(seen, total, torch.ones_like(total))


def phi_power(phi: str, power) -> float:
    """p of the log domain for a phi: the call's power for "power", 1 for |x|, ReLU and sigmoid."""
    if phi not in PHIS:
        raise ValueError(f"the oracle knows phi in {PHIS}, got {phi!r}")
    return power if phi == "power" else 1


def _scores(q, k, radius, power, log_abs_sinc, d_chunk=32, visible=None, phi="power"):
    """p sum_d log|sinc(R_d (q_id - k_jd))| (B, H, N, M); where ``visible`` (broadcasting to (B, H,
    N, M)) is False, the score is not formed: q - k is taken as 0 there, so that a NaN in a key that
    a row does not see reaches neither that row's score nor, through it, any gradient."""
    B, H, N, D = q.shape
    R = _radius_table(radius, H, D).to(q.dtype)
    S = None
    dead = torch.zeros(B, H, N, k.shape[2], dtype=torch.bool)  # (ReLU: a factor's sinc below 0)
    for d0 in range(0, D, d_chunk):
        d1 = min(D, d0 + d_chunk)
        diff = q[..., d0:d1].unsqueeze(3) - k[..., d0:d1].unsqueeze(2)
        if visible is not None:
            diff = torch.where(visible.unsqueeze(-1), diff, torch.zeros_like(diff))
        x = R[:, d0:d1].reshape(1, H, 1, 1, d1 - d0) * diff
        if phi == "sigmoid":  # (sinc in the same manner as the log|sinc| asked for: series or plain)
            sinc = _sinc_oracle if log_abs_sinc is _log_abs_sinc_oracle else _sinc_plain
            part = torch.nn.functional.logsigmoid(sinc(x)).sum(-1)
        else:
            part = log_abs_sinc(x).sum(-1)
        S = part if S is None else S + part
        if phi == "relu":
            dead |= (torch.sin(x.detach()) * x.detach() < 0).any(-1)
    if S is None:  # D = 0
        S = q.new_zeros(B, H, N, k.shape[2])
    S = phi_power(phi, power) * S
    return S.masked_fill(dead, float("-inf")) if phi == "relu" else S


def _softmax_zero_rows(S: torch.Tensor) -> torch.Tensor:
    m = S.amax(-1, keepdim=True) if S.shape[-1] > 0 else S.new_full(S.shape[:-1] + (1,), float("-inf"))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(S - m)
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def _weights(q, k, radius, power, attn_mask, key_padding_mask, causal, log_abs_sinc, dtype, normaliser_eps=0.0,
             phi="power"):
    q, k, radius = q.to(dtype), k.to(dtype), radius.to(dtype)
    B, H, N, _ = q.shape
    M = k.shape[2]
    # a masked key's score is never formed (a NaN in its key reaches no row), others get their mask
    mask = additive_mask(B, H, N, M, attn_mask, key_padding_mask, causal, dtype)
    visible = mask != float("-inf")
    S = torch.where(visible, _scores(q, k, radius, power, log_abs_sinc, visible=visible, phi=phi) + mask, mask)
    if signed_weights(phi, power):
        return _signed_normalised(S, _negative_products(q, k, radius, visible), visible, normaliser_eps)
    if normaliser_eps > 0:
        # w_ij / (sum_j w_ij + eps): eps is the weight of one more key, whose value is 0
        null = torch.full((B, H, N, 1), float(normaliser_eps), dtype=dtype).log()
        return _softmax_zero_rows(torch.cat([S, null], -1))[..., :M]
    return _softmax_zero_rows(S)


def oracle_weights(q, k, radius, power=4, attn_mask=None, key_padding_mask=None, causal=False, normaliser_eps=0.0,
                   phi="power"):
    """Normalised weights (B, H, N, M) in float64 (normaliser_eps > 0: w_ij / (sum_j w_ij + eps))."""
    return _weights(q, k, radius, power, attn_mask, key_padding_mask, causal, _log_abs_sinc_oracle, torch.float64,
                    normaliser_eps, phi)


def _dropped(P, dropout_scale):
    """P times the dropout factors f_ij (0 where dropped, 1 / (1 - p) where kept), if any."""
    return P if dropout_scale is None else P * dropout_scale.to(P.dtype)


def oracle_attention(q, k, v, radius, power=4, attn_mask=None, key_padding_mask=None, causal=False,
                     normaliser_eps=0.0, dropout_scale=None, phi="power"):
    """out (B, H, N, Dv) in float64, differentiable (see the module docstring)."""
    P = oracle_weights(q, k, radius, power, attn_mask, key_padding_mask, causal, normaliser_eps, phi)
    return torch.matmul(_dropped(P, dropout_scale), v.to(torch.float64))


def plain_weights(q, k, radius, power=4, attn_mask=None, key_padding_mask=None, causal=False, normaliser_eps=0.0,
                  phi="power"):
    """Normalised weights (B, H, N, M) in q's dtype, the plain way (see the module docstring)."""
    return _weights(q, k, radius, power, attn_mask, key_padding_mask, causal, _log_abs_sinc_plain, q.dtype,
                    normaliser_eps, phi)


def plain_attention(q, k, v, radius, power=4, attn_mask=None, key_padding_mask=None, causal=False, series=False,
                    normaliser_eps=0.0, dropout_scale=None, phi="power"):
    """The formula in q's dtype, the plain way (see the module docstring); with series=True,
    log|sinc| takes the oracle's series below |x| = 1e-3 (in q's dtype)."""
    log_abs_sinc = _log_abs_sinc_oracle if series else _log_abs_sinc_plain
    P = _weights(q, k, radius, power, attn_mask, key_padding_mask, causal, log_abs_sinc, q.dtype, normaliser_eps, phi)
    return torch.matmul(_dropped(P, dropout_scale), v.to(q.dtype))


def _gradients(fn, dtype, q, k, v, radius, grad_out, **kwargs):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, radius)]
    out = fn(*leaves, **kwargs)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype), allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)]
    return (out.detach(), *grads)


def oracle_gradients(q, k, v, radius, grad_out, **kwargs):
    """(out, dq, dk, dv, dradius) in float64, for loss = sum(out * grad_out)."""
    return _gradients(oracle_attention, torch.float64, q, k, v, radius, grad_out, **kwargs)


def plain_gradients(q, k, v, radius, grad_out, dtype=None, series=False, **kwargs):
    """(out, dq, dk, dv, dradius) of plain_attention in ``dtype`` (default: q's dtype)."""
    return _gradients(plain_attention, dtype or q.dtype, q, k, v, radius, grad_out, series=series, **kwargs)


def _dlog_sinc(x: torch.Tensor) -> torch.Tensor:
    """g(x) = d/dx log|sinc x| = cot x - 1/x (float64; its series below |x| = 1e-3)."""
    small = x.abs() < _SERIES_BOUND
    xl = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, -x / 3 - x**3 / 45, torch.cos(xl) / torch.sin(xl) - 1 / xl)


def _dlog_phi(x: torch.Tensor, phi: str) -> torch.Tensor:
    """d/dx of the log of phi(sinc x) over p: g(x) for the log-domain phis; for "sigmoid",
    sigmoid(-sinc x) sinc'(x), sinc'(x) = (x cos x - sin x) / x^2 (its series below |x| = 1e-3)."""
    if phi != "sigmoid":
        return _dlog_sinc(x)
    small = x.abs() < _SERIES_BOUND
    xl = torch.where(small, torch.ones_like(x), x)
    derivative = torch.where(small, -x / 3 + x**3 / 30, (xl * torch.cos(xl) - torch.sin(xl)) / (xl * xl))
    return torch.sigmoid(-_sinc_oracle(x)) * derivative


def _detached_float64(q, k, v, grad_out, radius):
    """q, k, v, grad_out and the radius detached in float64, and the radius's (H, D) table."""
    q, k, v, go, radius = (t.detach().to(torch.float64) for t in (q, k, v, grad_out, radius))
    return q, k, v, go, radius, _radius_table(radius, q.shape[1], q.shape[3])


def oracle_gradient_scales(q, k, v, radius, grad_out, power=4, attn_mask=None, key_padding_mask=None, causal=False,
                           normaliser_eps=0.0, dropout_scale=None, phi="power"):
    """Scales of (out, dq, dk, dv, dradius): see the module docstring. Floats."""
    q, k, v, go, radius, R = _detached_float64(q, k, v, grad_out, radius)
    B, H, N, D = q.shape
    M = k.shape[2]
    with torch.no_grad():
        P = oracle_weights(q, k, radius, power, attn_mask, key_padding_mask, causal, normaliser_eps, phi)  # (B, H, N, M)
        # Signed weights (odd p): a row's normaliser sum_j w_ij is a signed sum, whose relative
        # error is its terms' times c_i = sum_j |P_ij| (1 where the weights have one sign), and
        # every term of the row carries it: their weights are taken as c_i |P_ij|, and out_i's
        # terms include the normaliser's, |out_i| per unit of its error.
        signed = signed_weights(phi, power)
        c = P.abs().sum(-1, keepdim=True).clamp_min(1.0) if signed else None
        Pa = P.abs() * c if signed else P
        power = phi_power(phi, power)  # (the log domain's p: dS/dx = p g(x))
        # with dropout, dS_ij = P_ij (f_ij dP_ij - Delta_i), Delta_i = sum_j P_ij f_ij dP_ij
        dP = _dropped(torch.matmul(go, v.transpose(-1, -2)), dropout_scale)
        delta = (P * dP).sum(-1, keepdim=True)
        A = Pa * (dP.abs() + delta.abs())  # (B, H, N, M)
        diff = q.unsqueeze(3) - k.unsqueeze(2)  # (B, H, N, M, D)
        G = _dlog_phi(R.reshape(1, H, 1, 1, D) * diff, phi).abs() * A.unsqueeze(-1)
        dq = power * R.abs().reshape(1, H, 1, D) * G.sum(3)
        dk = power * R.abs().reshape(1, H, 1, D) * G.sum(2)
        dr = power * (G * diff.abs()).sum((0, 2, 3))  # (H, D)
        if normaliser_eps > 0:
            # The kernels sum dS/dR = sum_ij dS_ij g_ij (q_i - k_j) as sum_i (q_i - mu) sum_j dS_ij g_ij
            # - sum_j (k_j - mu) sum_i dS_ij g_ij, mu the slice's mean of q and k per feature. Without
            # the null key a row's dS sums to 0 and a row on one key has dS = 0 there; with it, that
            # key keeps dS = m (1 - m) dP, and at a near-duplicate (q - k tiny) the two parts cancel
            # to far below their sizes: their terms' absolute sums join the scale.
            g = _dlog_phi(R.reshape(1, H, 1, 1, D) * diff, phi)
            dS = (P * (dP - delta)).unsqueeze(-1) * g  # (B, H, N, M, D)
            mu = torch.cat([q, k], 2).mean(2, keepdim=True)
            dr = dr + power * ((q - mu).abs() * dS.sum(3).abs()).sum((0, 2)) \
                + power * ((k - mu).abs() * dS.sum(2).abs()).sum((0, 2))
        shape = tuple(radius.shape)
        if shape in ((), (1,), (1, 1)):
            dr = dr.sum()
        elif shape == (H, 1):
            dr = dr.sum(1)
        elif shape in ((D,), (1, D)):
            dr = dr.sum(0)
        out = torch.matmul(_dropped(Pa, dropout_scale), v.abs())
        if signed:
            out = out + c * torch.matmul(_dropped(P, dropout_scale), v).abs()
        dv = torch.matmul(_dropped(Pa, dropout_scale).transpose(-1, -2), go.abs())
    return tuple(t.abs().max().item() if t.numel() else 0.0 for t in (out, dq, dk, dv, dr))


def null_key_scales(q, k, v, radius, grad_out, power=4, attn_mask=None, key_padding_mask=None, causal=False,
                    normaliser_eps=0.0, dropout_scale=None, phi="power"):
    """Scales of (out, dq, dk, dv, dradius) for the null key's term of oracle_mismatches' bound.

    With the null key the kernels scale each row by its real keys' share m_i = sigmoid(lse_i -
    log eps), and their lse_i is off by a few float32 eps per feature and power (absolute), so
    m_i is off by a relative delta_i <= 2 p D eps32 (1 - m_i). That scales row i's weights P~_ij
    = m_i P_ij and so its dS_ij = P~_ij (f_ij dP_ij - Delta~_i) by (1 + delta_i), and Delta~_i by
    (1 + delta_i) once more: row i's part of a gradient moves by delta_i (c_i - e_i), c_i its
    signed contribution through dS, e_i the signed sum of the terms P~_ij Delta~_i (with the
    same factors as dS). Hence the scale sum over rows of (1 - m_i) (|c_i| + |e_i|): zero where
    the null key takes nothing, and signed sums within a row (a row's terms cancel in its
    contribution exactly as they do in the exact gradient), not sums of absolute values.
    Floats; all zero without the null key."""
    if not normaliser_eps > 0:
        return (0.0,) * 5
    q, k, v, go, radius, R = _detached_float64(q, k, v, grad_out, radius)
    B, H, N, D = q.shape
    M = k.shape[2]
    with torch.no_grad():
        S = _scores(q, k, radius, power, _log_abs_sinc_oracle, phi=phi) + additive_mask(B, H, N, M, attn_mask,
                                                                                      key_padding_mask, causal)
        lse = torch.logsumexp(S, -1)
        seen = torch.isfinite(lse)
        gap = torch.sigmoid(torch.log(torch.tensor(float(normaliser_eps), dtype=torch.float64)) - lse)  # 1 - m_i
        if signed_weights(phi, power):  # |eps / (Z + eps)| for the signed sum Z (the kernels add eps e^-L to it)
            m = torch.where(seen, S.amax(-1), torch.zeros_like(lse)).unsqueeze(-1)
            negative = _negative_products(q, k, radius, torch.isfinite(S))
            Z = torch.where(negative, -torch.exp(S - m), torch.exp(S - m)).sum(-1)
            null = normaliser_eps * torch.exp(-m.squeeze(-1))
            gap = (null / (Z + null)).abs()
        gap = torch.where(seen, gap, torch.zeros_like(gap)).unsqueeze(-1)  # (B, H, N, 1)
        P = oracle_weights(q, k, radius, power, attn_mask, key_padding_mask, causal, normaliser_eps, phi)
        power = phi_power(phi, power)  # (the log domain's p: dS/dx = p g(x))
        Pf = _dropped(P, dropout_scale)
        dP = _dropped(torch.matmul(go, v.transpose(-1, -2)), dropout_scale)
        delta = (P * dP).sum(-1, keepdim=True)
        dS, E = P * (dP - delta), P * delta  # (B, H, N, M)
        diff = q.unsqueeze(3) - k.unsqueeze(2)
        g = _dlog_phi(R.reshape(1, H, 1, 1, D) * diff, phi)  # (B, H, N, M, D)
        Rr = R.abs().reshape(1, H, 1, 1, D)
        # dq: one row per element; dk, dv: one term per row
        dq = power * (gap * ((dS.unsqueeze(-1) * g).sum(3).abs() + (E.unsqueeze(-1) * g).sum(3).abs())) \
            * R.abs().reshape(1, H, 1, D)
        dk = power * (gap.unsqueeze(-1) * Rr * ((dS.unsqueeze(-1) * g).abs() + (E.unsqueeze(-1) * g).abs())).sum(2)
        dv = torch.matmul((gap * Pf.abs()).transpose(-1, -2), go.abs())
        out = (gap * torch.matmul(Pf, v)).abs()
        # dradius: row (b, h, i)'s contribution sums over j, and over d where the radius is shared
        c, e = ((X.unsqueeze(-1) * g * diff).sum(3) for X in (dS, E))  # (B, H, N, D)
        shape = tuple(radius.shape)
        if shape in ((), (1,), (1, 1), (H, 1)):
            c, e = c.sum(-1, keepdim=True), e.sum(-1, keepdim=True)
        dr = power * (gap * (c.abs() + e.abs())).sum(2)  # (B, H, D or 1)
        dr = dr.sum(0)
        if shape in ((), (1,), (1, 1)):
            dr = dr.sum()
        elif shape in ((D,), (1, D)):
            dr = dr.sum(0)
    return tuple(t.abs().max().item() if t.numel() else 0.0 for t in (out, dq, dk, dv, dr))


EPS32 = 2.0**-24
PLAIN_FACTOR = 4.0
SCALE_FACTOR = 16.0
UNDERFLOW = 1e-30
NAMES = ("out", "dq", "dk", "dv", "dradius")


def oracle_mismatches(ours, q, k, v, radius, grad_out, series=True, **kwargs):
    """Which of ours = (out, dq, dk, dv, dradius) break the float32 bound; [] if none.

    series=True (the default) takes the bound's plain float32 implementation with the oracle's
    series of log|sinc| near 0 (plain_gradients(series=True)): the quotient's derivative cancels
    where |x| is tiny (near-duplicate keys, a radius near 0), and the bound it gives there can be
    as large as the gradient itself (series=False: that looser bound)."""
    args = (q, k, v, radius, grad_out)
    exact = oracle_gradients(*args, **kwargs)
    plain = plain_gradients(*[t.float() for t in args], series=series, **kwargs)
    scales = oracle_gradient_scales(*args, **kwargs)
    # With the null key, each row is scaled by m_i = sigmoid(lse_i - log eps), so the kernels'
    # absolute error in lse_i (their products of per-feature table ratios: a few eps per
    # feature and power, also where a plain float32 log-sum is exact, as at a duplicate key)
    # becomes a relative error of up to 2 p D eps (1 - m_i) of the row's share (two roundings per
    # feature, the table ratio and the product, each raised to the power p): null_key_scales.
    null_factor = 2 * phi_power(kwargs.get("phi", "power"), kwargs.get("power", 4)) * q.shape[-1]
    nulls = null_key_scales(*args, **kwargs)
    bad = []
    for name, a, x, pl, scale, null in zip(NAMES, ours, exact, plain, scales, nulls):
        if a is None:
            continue
        if tuple(a.shape) != tuple(x.shape):
            bad.append(f"{name}: shape {tuple(a.shape)}, expected {tuple(x.shape)}")
            continue
        if not torch.isfinite(a).all():
            bad.append(f"{name}: not finite")
            continue
        err = (a.detach().double() - x).abs().max().item() if a.numel() else 0.0
        perr = (pl.double() - x).abs().max().item() if pl.numel() else 0.0
        bound = PLAIN_FACTOR * perr + SCALE_FACTOR * EPS32 * scale + null_factor * EPS32 * null + UNDERFLOW
        if not err <= bound:
            bad.append(f"{name}: error {err:.3e} > 4 x plain {perr:.3e} + 16 eps x scale {scale:.3e}"
                       + (f" + {null_factor:g} eps x null-key scale {null:.3e}" if null else ""))
    return bad


def lse_mismatches(lse, q, k, radius, power=4, attn_mask=None, key_padding_mask=None, causal=False, phi="power", **_):
    """Whether a kernel's log-normaliser lse (B, H, N): log sum_j exp S_ij over the visible keys
    (+inf for a row that sees none), is within the float32 bound; [] if so. Per row i:
    4 x the plain float32 log-sum's error + 16 eps32 (sum_j P_ij |S'_ij| + p D) + 1e-30, with S'
    the scores without the masks: lse's error is the P-weighted mean of the scores' errors, each
    a few eps relative (products and logs of D factors) plus a few eps absolute per feature and
    power (a log of a ratio near 1 rounds to an absolute eps, also where |S'| is tiny)."""
    B, H, N, D = q.shape
    M = k.shape[2]
    sinc_part = _scores(q.double(), k.double(), radius.double(), power, _log_abs_sinc_oracle, phi=phi)
    exact_scores = sinc_part + additive_mask(B, H, N, M, attn_mask, key_padding_mask, causal)
    plain_scores = (_scores(q.float(), k.float(), radius.float(), power, _log_abs_sinc_plain, phi=phi)
                    + additive_mask(B, H, N, M, attn_mask, key_padding_mask, causal, torch.float32))
    if signed_weights(phi, power):  # log|sum_j sign_ij e^S_ij|
        negative = _negative_products(q.double(), k.double(), radius.double(), torch.isfinite(exact_scores))
        exact, plain = (_log_abs_signed_sum(S, negative) for S in (exact_scores, plain_scores))
    else:
        exact = torch.logsumexp(exact_scores, -1)
        plain = torch.logsumexp(plain_scores, -1)
    ours = lse.detach().double().cpu()
    if tuple(ours.shape) != (B, H, N):
        return [f"lse: shape {tuple(ours.shape)}, expected {(B, H, N)}"]
    dead = torch.isneginf(exact)
    if not torch.equal(torch.isposinf(ours), dead):
        return ["lse: +inf exactly where a row sees no key: no"]
    live = ~dead
    if not live.any():
        return []
    weights = torch.exp(exact_scores - torch.where(dead, torch.zeros_like(exact), exact).unsqueeze(-1))
    scale = (weights * sinc_part.abs()).nan_to_num(0.0).sum(-1) + phi_power(phi, power) * D
    err = (ours - exact)[live].abs()
    bound = PLAIN_FACTOR * (plain.double() - exact)[live].abs() + SCALE_FACTOR * EPS32 * scale[live] + UNDERFLOW
    if not bool(torch.isfinite(err).all()) or bool((err > bound).any()):
        worst = int(torch.nan_to_num(err - bound, nan=float("inf")).argmax())
        return [f"lse: error {err[worst].item():.3e} > 4 x plain + 16 eps x (sum_j P_ij |S'_ij| + p D) = "
                f"{bound[worst].item():.3e}"]
    return []


def _log_abs_signed_sum(S, negative):
    """log|sum_j sign_ij e^S_ij| per row (-inf for a row with no finite score)."""
    m = S.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(S - m)
    return torch.log(torch.where(negative, -e, e).sum(-1).abs()) + m.squeeze(-1)


def float64_mismatches(ours, q, k, v, radius, grad_out, **kwargs):
    """Which of ours = (out, dq, dk, dv, dradius), computed in float64, are further than 1e-9 of
    the scale from the oracle (a float64 kernel's own series and Taylor branches agree far
    closer; the slack is for sums of many terms); [] if none."""
    args = (q, k, v, radius, grad_out)
    exact = oracle_gradients(*args, **kwargs)
    scales = oracle_gradient_scales(*args, **kwargs)
    bad = []
    for name, a, x, scale in zip(NAMES, ours, exact, scales):
        err = (a.detach().double() - x).abs().max().item() if a.numel() else 0.0
        if not err <= 1e-9 * scale + 1e-300:
            bad.append(f"{name}: error {err:.3e} > 1e-9 x scale {scale:.3e}")
    return bad
