"""Gaussian-kernel attention: the ablation that tells what sinc adds.

    w_ij = exp(-(p / 6) sum_d R_d^2 (q_id - k_jd)^2),   out_i = sum_j w_ij v_j / sum_j w_ij

is the small-x limit of Fourier integral attention with the same p and R
(p log|sinc x| = -p x^2 / 6 - p x^4 / 180 - ...): the two agree while |R (q_d - k_d)| stays
well inside sinc's main lobe and part where it reaches sinc's zeros at x = m pi. Its
log-weights are -(p/6) (|q'|^2 - 2 q'.k' + |k'|^2) with q' = R q, k' = R k; the |q'|^2 term
is the same for every key of a row and drops out of the normalisation, so the op is one
scaled dot product with a per-key bias. It materialises the (B, H, N, M) scores (an
ablation, not a fast path) and takes the same arguments and masks as ``fourier_attention``;
``normaliser_eps`` must be 0 (the dropped per-row constant leaves a null key of weight eps no
fixed meaning).
"""
from __future__ import annotations

import torch

from .inputs import AttentionInputs, prepare_inputs
from .reference import additive_mask, dropout_keep_mask, draw_seed


def gaussian_log_weights(inp: AttentionInputs) -> torch.Tensor:
    """S_ij = -(p/6) sum_d R_d^2 (q_id - k_jd)^2 + masks, up to a per-row constant: (B, H, N, M)."""
    r = inp.radius_hd.to(inp.q.dtype).unsqueeze(0).unsqueeze(2)  # (1, H, 1, D)
    qr, kr = inp.q * r, inp.k * r
    c = inp.power / 6.0
    S = (2 * c) * (qr @ kr.transpose(-1, -2)) - c * kr.pow(2).sum(-1).unsqueeze(-2)
    mask = additive_mask(inp)
    return S if mask is None else S + mask


def gaussian_attention(q, k, v, radius, *, power=4, phi="power", attn_mask=None, key_padding_mask=None,
                       causal=False, dropout_p=0.0, need_weights=False, backend="auto", normaliser_eps=0.0):
    """Same contract as ``fourier_attention`` (``backend`` is accepted and ignored: one implementation;
    ``normaliser_eps`` is accepted as 0 only)."""
    if phi != "power":
        raise ValueError(f"gaussian_attention takes phi='power', got {phi!r}")
    inp = prepare_inputs(q, k, v, radius, power=power, phi=phi, attn_mask=attn_mask,
                         key_padding_mask=key_padding_mask, causal=causal, dropout_p=dropout_p,
                         normaliser_eps=normaliser_eps)
    if inp.normaliser_eps > 0:
        raise ValueError(
            f"gaussian_attention takes normaliser_eps=0, got {normaliser_eps!r}: its scores drop a per-row "
            "constant, so a null key of weight eps has no fixed meaning there (the published normaliser "
            "is for the sinc kernel)"
        )
    S = gaussian_log_weights(inp)
    seen = torch.isfinite(S).any(-1, keepdim=True)
    P = torch.softmax(torch.where(seen, S, torch.zeros_like(S)), dim=-1) * seen  # rows with no key: 0
    if inp.dropout_p > 0:
        keep = dropout_keep_mask(draw_seed(), tuple(P.shape), inp.dropout_p, P.device)
        P_used = P * keep / (1.0 - inp.dropout_p)
    else:
        P_used = P
    out = P_used @ v
    # the weights as applied to v (after dropout), as fourier_attention returns them: out = P_used v
    return (out, P_used) if need_weights else out
