"""Fourier integral attention (FourierFormer, Nguyen et al. 2022), as a PyTorch op.

    out = fourier_attention(q, k, v, radius, power=4)

computes, for each batch b and head h,

    w_ij = prod_d phi(sinc(R_d (q_id - k_jd))),   out_i = sum_j w_ij v_j / sum_j w_ij

with phi(x) = x^p (or |x|, ReLU, sigmoid: the phi keyword). Backends: "cuda" and "cpu" (fused
kernels in the log domain with a saved log-normaliser: even p, |x| and ReLU, the log domain with
p = 1, sigmoid, and odd p, whose signed weights keep a sign beside their log-magnitude) and "reference" (pure PyTorch, every phi); what each accepts is declared
once, in backends.py.

Importing this package loads the compiled extension (extension.py) and registers the fused
ops' shape and autograd implementations (fused.py); without a usable extension it warns once
and every call runs on the reference.
"""
from __future__ import annotations

import warnings

import torch

from .backends import BACKENDS, DECLARATIONS, get_backend
from .extension import extension_status
from .fused import fused_forward, fused_forward_and_weights, key_table_width
from .inputs import AttentionInputs, prepare_inputs
from .reference import (
    attention_weights,
    draw_seed,
    dropout_keep_mask,
    fourier_attention_reference,
    reference_from_inputs,
)

__all__ = [
    "BACKENDS",
    "DECLARATIONS",
    "backend_unavailable_reason",
    "dropout_keep_mask",
    "fourier_attention",
    "fourier_attention_reference",
    "get_backend",
    "append_to_key_table",
    "key_table",
    "key_table_keys",
    "select_backend",
]

_warned_fallbacks: set = set()


def backend_unavailable_reason(backend: str, inp: AttentionInputs | None = None) -> str:
    """Why ``backend`` cannot run these inputs (or, with inp=None, at all), every reason
    joined by '; '; '' if it can. The reasons are the backend's declaration's (backends.py)."""
    if backend not in DECLARATIONS:
        return f"unknown backend {backend!r}; choose from {BACKENDS + ('auto',)}"
    return "; ".join(DECLARATIONS[backend].not_supported_reasons(inp))


def _warn_fallback(skipped: dict) -> None:
    """Warns, once per distinct set of reasons, that 'auto' runs the slow reference."""
    key = tuple((name, tuple(reasons)) for name, reasons in skipped.items())
    if key in _warned_fallbacks:
        return
    _warned_fallbacks.add(key)
    why = " ".join(f"{name}: {'; '.join(reasons)}." for name, reasons in skipped.items())
    warnings.warn(
        f"fourier_attention: backend 'auto' runs the (slow, O(N M) memory) PyTorch reference for this call, "
        f"as no fused kernel can: {why}",
        RuntimeWarning,
        stacklevel=4,  # the caller of fourier_attention
    )


def select_backend(backend: str, inp: AttentionInputs) -> str:
    """'auto' -> the first backend (fastest first) that can run inp; an explicit name -> it,
    or ValueError with every reason why not.

    'auto' warns once when it falls back to the reference while the extension is loaded.
    """
    if backend == "auto":
        skipped = {}
        for name, declaration in DECLARATIONS.items():
            reasons = declaration.not_supported_reasons(inp)
            if not reasons:
                if not declaration.fused and skipped and extension_status().loaded:
                    _warn_fallback(skipped)
                return name
            skipped[name] = reasons
        raise AssertionError("the reference backend runs every call")  # pragma: no cover
    reasons = get_backend(backend).not_supported_reasons(inp)
    if reasons:
        raise ValueError(f"fourier_attention: backend {backend!r} cannot run this call: {'; '.join(reasons)}")
    return backend


def fourier_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor | float,
    *,
    power: int = 4,
    phi: str = "power",
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    normaliser_eps: float = 0.0,
    need_weights: bool = False,
    backend: str = "auto",
    key_table: torch.Tensor | None = None,
):
    """Fourier integral attention.

    Args:
        q: (B, H, N, D) queries; k: (B, H, M, D) keys; v: (B, H, M, Dv) values.
        radius: R, learnable: a scalar, (H, 1) per head, (D,) or (H, D) per feature; or a Python
            number (a fixed R, no gradient).
        power: p of phi(x) = x^p (phi="power"). Even p: log domain, fused kernels. Odd p: signed
            weights normalised directly, w_ij / (sum_j w_ij + eps) (diverges, as in the paper); the
            CPU kernels and the reference run it.
        phi: "power", or "abs", "relu", "sigmoid" (the paper's Table 7; power is then ignored).
            "abs": prod_d |sinc|, the log domain with p = 1; "relu": prod_d max(sinc, 0), the same
            with a zero weight (score -inf) wherever a factor's sinc is negative (a row whose
            every key has one gives 0, as a fully masked row); "sigmoid": prod_d sigmoid(sinc),
            the log domain with scores sum_d log sigmoid(sinc). backends.py declares which backend
            runs which phi (the CPU kernel all three, the CUDA kernels abs and relu).
        attn_mask: additive float mask (0 / -inf, or any finite values), (N, M), (B*H, N, M) or
            (B|1, H|1, N, M); or a bool mask, True marking the positions that may not be
            attended (it stays bool down to the kernels, which then only select).
        key_padding_mask: bool (B, M), True = padding.
        causal: key j > query i excluded; with N < M, queries are the last N positions.
        dropout_p: attention dropout on the normalised weights, drawn from a counter-based
            RNG seeded from torch's CPU generator (same mask on every backend).
        normaliser_eps: eps of the published code's normaliser, out_i = sum_j w_ij v_j /
            (sum_j w_ij + eps): a null key of log-weight log(eps) and value 0 (the weights of a
            row then sum to less than 1); 0 (default): exact normalisation over the keys.
        need_weights: also return the normalised weights (B, H, N, M) (materialised), after
            dropout, as the backend computed them (a fused backend takes the identity as values,
            P I = P: beside v in the same call where both fit its value width, else in calls of
            their own; see ``fused.fused_forward_and_weights``).
        backend: "auto" (cuda, then cpu, then reference), or one of them explicitly.
        key_table: ``key_table(k)``, or one with room for more keys (incremental decoding keeps it
            between steps): the CPU backend reads it instead of transposing k (k may then be its
            view, ``key_table_keys``); the other backends, and weights that need calls of their
            own, ignore it. It holds the keys alone, so it holds under any radius.

    Rows whose keys are all masked give a zero output and zero gradients (also with
    normaliser_eps, as do rows whose weights all underflow next to eps). A NaN or infinite input
    that enters a row's visible scores (its query, a key it sees, the radius, a NaN or +inf mask
    entry) or the value of a key it sees makes that row NaN, and its gradients where the formula's
    are; a masked key's NaN reaches no row (docs/kernels.md, "NaN and infinity").
    """
    inp = prepare_inputs(
        q, k, v, radius, power=power, phi=phi, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
        causal=causal, dropout_p=dropout_p, normaliser_eps=normaliser_eps,
    )
    name = select_backend(backend, inp)
    seed = draw_seed() if inp.dropout_p > 0 else 0
    if name == "reference":
        return reference_from_inputs(inp, need_weights, seed)
    tables = key_table if name == "cpu" else None
    if need_weights:  # the kernel's own weights (the identity as values, beside v where it fits)
        return fused_forward_and_weights(inp, seed, get_backend(name).max_head_dim, tables)
    return fused_forward(inp, seed, tables=tables)


def key_table(k: torch.Tensor, room: int | None = None) -> torch.Tensor | None:
    """The CPU backend's key table of k (B, H, M, D): what ``fourier_attention_tables`` returns on
    the CPU, the keys alone in the layout its short-query forward reads (csrc/backend_limits.h,
    ``kCpuKeyTableKeys``: (B, H, D, Mt), key j at [..., j], Mt a multiple of
    ``DECLARATIONS["cpu"].key_table_keys``), with room for at least ``room`` keys (default M; the
    room past M is zero). None where no backend would read one: k not float32 on the CPU, or
    no extension."""
    if not (extension_status().loaded and k.device.type == "cpu" and k.dtype == torch.float32):
        return None
    B, H, M, D = k.shape
    room = M if room is None else max(int(room), M)
    if room > M:
        k = torch.cat([k, k.new_zeros(B, H, room - M, D)], dim=2)
    return torch.ops.fourierformer.fourier_attention_tables(k[:, :, :0], k, k.new_zeros(H, D))


def key_table_keys(table: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` keys a key table holds, (B, H, count, D): a view of the table (no copy).
    Passed as k with the table itself as ``key_table=``, a short-query call on the CPU reads the
    keys from the table alone (incremental decoding keeps no other copy of them)."""
    return table[..., :count].transpose(2, 3)


def append_to_key_table(table: torch.Tensor, count: int, k: torch.Tensor) -> torch.Tensor:
    """The table holding its first ``count`` keys followed by k (B, H, n, D): k is written in place
    where the table has room for it; otherwise a table of the least room that holds them all
    (``key_table``'s rule) is returned, the old one left as it was."""
    total = count + k.size(2)
    if table.size(-1) < total:
        grown = table.new_zeros(*table.shape[:-1], key_table_width(total))
        grown[..., :count] = table[..., :count]
        table = grown
    table[..., count:total] = k.transpose(2, 3)
    return table
