"""Validation and normalisation of the arguments of ``fourier_attention``.

Every backend (reference, fused CPU, fused CUDA) sees the same normalised
inputs, so shape rules and error messages live here once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

PHIS = ("power", "abs", "relu", "sigmoid")
#: the shapes of a learnable radius, by name (what ``radius_parameter_shape`` makes; ``expand_radius`` takes each)
RADIUS_SHAPES = ("scalar", "head", "feature", "vector")


@dataclass
class AttentionInputs:
    q: torch.Tensor  # (B, H, N, D)
    k: torch.Tensor  # (B, H, M, D)
    v: torch.Tensor  # (B, H, M, Dv)
    radius_hd: torch.Tensor  # (H, D), differentiable view of the user's radius
    power: int
    phi: str
    # (B|1, H|1, N, M): additive float, or bool (True = may not be attended), as the caller gave it
    attn_mask: Optional[torch.Tensor]
    key_padding_mask: Optional[torch.Tensor]  # bool (B, M), True = padding
    causal: bool
    dropout_p: float
    # the published code's normaliser: out_i = sum_j w_ij v_j / (sum_j w_ij + eps); 0: exact
    normaliser_eps: float = 0.0

    @property
    def log_domain(self) -> bool:
        """True when the weights are non-negative, so softmax of log-weights is exact."""
        return non_negative_weights(self.phi, self.power)


def non_negative_weights(phi: str, power: int) -> bool:
    """Whether the weights prod_d phi(sinc(R (q_d - k_d))) are never negative: every phi but an odd power."""
    return phi != "power" or power % 2 == 0


def expand_radius(radius: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Broadcast a scalar, per-head (H, 1), per-feature (D,) or (H, D) radius to (H, D)."""
    if not isinstance(radius, torch.Tensor):
        raise TypeError(f"radius must be a tensor, got {type(radius).__name__}")
    shape = tuple(radius.shape)
    allowed = {(), (1,), (1, 1), (num_heads, 1), (head_dim,), (1, head_dim), (num_heads, head_dim)}
    if shape not in allowed:
        raise ValueError(
            f"radius has shape {shape}; expected a scalar, (H, 1) = ({num_heads}, 1) per head, "
            f"(D,) = ({head_dim},) or (H, D) = ({num_heads}, {head_dim}) per feature"
        )
    # every allowed shape broadcasts to (H, D) as it is (no reshape: one view, one backward node)
    return radius.expand(num_heads, head_dim)


def radius_parameter_shape(radius_shape: str, num_heads: int, head_dim: int) -> Tuple[int, ...]:
    """Shape of a learnable radius: () scalar, (H, 1) per head, (H, D) per head and feature, (D,) per
    feature and shared by the heads (the paper's "learnable vector R", Table 8)."""
    if radius_shape == "scalar":
        return ()
    if radius_shape == "head":
        return (num_heads, 1)
    if radius_shape == "feature":
        return (num_heads, head_dim)
    if radius_shape == "vector":
        return (head_dim,)
    raise ValueError(f"radius_shape must be one of {RADIUS_SHAPES}, got {radius_shape!r}")


def _normalise_attn_mask(mask: torch.Tensor, B: int, H: int, N: int, M: int, like: torch.Tensor) -> torch.Tensor:
    # A bool mask stays bool (nn.MultiheadAttention / fairseq convention: True marks a position
    # that may not be attended), so every backend knows from its dtype that it only selects.
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"attn_mask must be an additive float mask (0 / -inf) or bool, got {mask.dtype}")
    if mask.device != like.device:
        raise ValueError(f"attn_mask is on {mask.device} but q is on {like.device}")
    shape = tuple(mask.shape)
    if shape == (N, M):
        mask = mask.reshape(1, 1, N, M)
    elif shape == (B * H, N, M):
        mask = mask.reshape(B, H, N, M)
    elif len(shape) == 4 and shape[2:] == (N, M) and shape[0] in (1, B) and shape[1] in (1, H):
        pass
    else:
        raise ValueError(
            f"attn_mask has shape {shape}; expected (N, M) = ({N}, {M}), (B*H, N, M) = ({B * H}, {N}, {M}) "
            f"or (B|1, H|1, N, M)"
        )
    return mask


def _key_padding_mask(mask: torch.Tensor, B: int, M: int, like: torch.Tensor) -> torch.Tensor:
    if tuple(mask.shape) != (B, M):
        raise ValueError(f"key_padding_mask has shape {tuple(mask.shape)}; expected (B, M) = ({B}, {M})")
    if mask.device != like.device:
        raise ValueError(f"key_padding_mask is on {mask.device} but q is on {like.device}")
    if mask.dtype != torch.bool:
        if mask.is_floating_point():
            raise TypeError("key_padding_mask must be bool or integer (True / nonzero = padding), got a float tensor")
        mask = mask != 0
    return mask


def prepare_inputs(
    q, k, v, radius, *, power=4, phi="power", attn_mask=None, key_padding_mask=None, causal=False, dropout_p=0.0,
    normaliser_eps=0.0,
) -> AttentionInputs:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, seq, dim), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    B, H, N, D = q.shape
    if k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(f"k has shape {tuple(k.shape)}; expected (B, H, M, D) = ({B}, {H}, M, {D})")
    M = k.shape[2]
    if v.shape[:3] != (B, H, M):
        raise ValueError(f"v has shape {tuple(v.shape)}; expected (B, H, M, Dv) = ({B}, {H}, {M}, Dv)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if isinstance(radius, (int, float)) and not isinstance(radius, bool):  # a fixed radius (no gradient)
        radius = torch.tensor(float(radius), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32,
                              device=q.device)
    elif not isinstance(radius, torch.Tensor):
        raise TypeError(f"radius must be a tensor or a Python number, got {type(radius).__name__}")
    if not (q.device == k.device == v.device == radius.device):
        raise ValueError(f"q, k, v, radius must be on one device, got {q.device}, {k.device}, {v.device}, {radius.device}")
    if phi not in PHIS:
        raise ValueError(f"phi must be one of {PHIS}, got {phi!r}")
    if isinstance(power, bool) or int(power) != power or power < 1:
        raise ValueError(f"power must be a positive integer, got {power!r}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if isinstance(normaliser_eps, bool) or not math.isfinite(float(normaliser_eps)) or float(normaliser_eps) < 0:
        raise ValueError(f"normaliser_eps must be finite and >= 0, got {normaliser_eps!r}")
    if causal and N > M:
        raise ValueError(f"causal attention needs N <= M (queries aligned to the last keys), got N={N}, M={M}")
    return AttentionInputs(
        q=q,
        k=k,
        v=v,
        radius_hd=expand_radius(radius, H, D),
        power=int(power),
        phi=phi,
        attn_mask=None if attn_mask is None else _normalise_attn_mask(attn_mask, B, H, N, M, q),
        key_padding_mask=None if key_padding_mask is None else _key_padding_mask(key_padding_mask, B, M, q),
        causal=bool(causal),
        dropout_p=float(dropout_p),
        normaliser_eps=float(normaliser_eps),
    )


def causal_bias(N: int, M: int, device, dtype=torch.float32) -> torch.Tensor:
    """(N, M) additive mask: query i (aligned to key M - N + i) sees keys j <= M - N + i."""
    i = torch.arange(N, device=device).unsqueeze(1) + (M - N)
    j = torch.arange(M, device=device).unsqueeze(0)
    return torch.zeros((N, M), dtype=dtype, device=device).masked_fill(j > i, float("-inf"))
