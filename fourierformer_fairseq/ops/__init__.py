"""Fourier integral attention (FourierFormer, Nguyen et al. 2022), as a PyTorch op.

    out = fourier_attention(q, k, v, radius, power=4)

computes, for each batch b and head h,

    w_ij = prod_d phi(sinc(R_d (q_id - k_jd))),   out_i = sum_j w_ij v_j / sum_j w_ij

with phi(x) = x^p. Backends: "cuda" and "cpu" (fused kernels, even p only, in the log
domain with a saved log-normaliser) and "reference" (pure PyTorch, every phi).
"""
from __future__ import annotations

import torch

from .extension import extension_status
from .fused import fused_available, fused_forward
from .inputs import AttentionInputs, prepare_inputs
from .reference import (
    attention_weights,
    draw_seed,
    dropout_keep_mask,
    fourier_attention_reference,
    reference_from_inputs,
)

BACKENDS = ("cuda", "cpu", "reference")
CUDA_MAX_HEAD_DIM = 256

__all__ = [
    "BACKENDS",
    "backend_unavailable_reason",
    "dropout_keep_mask",
    "fourier_attention",
    "fourier_attention_reference",
    "select_backend",
]


def backend_unavailable_reason(backend: str, inp: AttentionInputs | None = None) -> str:
    """Why ``backend`` cannot run these inputs (or, with inp=None, at all); '' if it can."""
    if backend == "reference":
        return ""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r}; choose from {BACKENDS + ('auto',)}"
    status = extension_status()
    if not status.loaded:
        return status.reason
    if backend == "cuda" and not status.has_cuda:
        return f"the extension was compiled without CUDA (torch {status.build.get('torch_version')})"
    if inp is None:
        return ""
    device = inp.q.device.type
    if device != backend:
        return f"inputs are on {device}"
    if not (inp.phi == "power" and inp.power % 2 == 0):
        what = f"phi={inp.phi!r}" if inp.phi != "power" else f"power={inp.power} (odd)"
        return f"fused kernels take phi(x) = x^p with even p only, got {what}; the reference runs it"
    allowed = (torch.float32, torch.float64) if backend == "cpu" else (torch.float32, torch.float16, torch.bfloat16)
    if inp.q.dtype not in allowed:
        return f"the {backend} kernel takes {', '.join(str(t) for t in allowed)}, got {inp.q.dtype}"
    if backend == "cuda" and max(inp.q.shape[-1], inp.v.shape[-1]) > CUDA_MAX_HEAD_DIM:
        return f"the cuda kernel takes head dims up to {CUDA_MAX_HEAD_DIM}"
    for name, t in (("attn_mask", inp.attn_mask),):
        if t is not None and t.requires_grad:
            return f"{name} requires grad; only the reference differentiates masks"
    return ""


def select_backend(backend: str, inp: AttentionInputs) -> str:
    """'auto' -> the fastest backend that can run inp; an explicit name -> it, or ValueError why not."""
    if backend == "auto":
        for name in BACKENDS:
            if not backend_unavailable_reason(name, inp):
                return name
    reason = backend_unavailable_reason(backend, inp)
    if reason:
        raise ValueError(f"fourier_attention: backend {backend!r} cannot run this call: {reason}")
    return backend


def fourier_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor,
    *,
    power: int = 4,
    phi: str = "power",
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    backend: str = "auto",
):
    """Fourier integral attention.

    Args:
        q: (B, H, N, D) queries; k: (B, H, M, D) keys; v: (B, H, M, Dv) values.
        radius: R, learnable: a scalar, (H, 1) per head, (D,) or (H, D) per feature.
        power: p of phi(x) = x^p (phi="power"). Even p: log domain, fused kernels.
            Odd p: direct normalisation on the reference backend (diverges, as in the paper).
        phi: "power", or "abs", "relu", "sigmoid" (reference backend; the paper's Table 7).
        attn_mask: additive float mask (0 / -inf), (N, M), (B*H, N, M) or (B|1, H|1, N, M);
            a bool mask marks with True the positions that may not be attended.
        key_padding_mask: bool (B, M), True = padding.
        causal: key j > query i excluded; with N < M, queries are the last N positions.
        dropout_p: attention dropout on the normalised weights, drawn from a counter-based
            RNG seeded from torch's CPU generator (same mask on every backend).
        need_weights: also return the normalised weights (B, H, N, M) (materialised).
        backend: "auto" (cuda, then cpu, then reference), or one of them explicitly.

    Rows whose keys are all masked give a zero output and zero gradients.
    """
    inp = prepare_inputs(
        q, k, v, radius, power=power, phi=phi, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
        causal=causal, dropout_p=dropout_p,
    )
    name = select_backend(backend, inp)
    seed = draw_seed() if inp.dropout_p > 0 else 0
    if name == "reference":
        return reference_from_inputs(inp, need_weights, seed)
    out = fused_forward(inp, seed)
    if need_weights:
        return out, attention_weights(inp, seed)
    return out
