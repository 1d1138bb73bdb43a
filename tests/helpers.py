"""What the tests share besides the oracle: the tolerance rule, the error measures, seeded inputs,
the heads' layout and the masks.

    check_against_plain(ours, plain, exact, what, atol, factor=2)
        the tolerance rule (flash-attention's): ``max |ours - exact| <= factor max |plain - exact|
        + atol``, with ``plain`` the same computation written plainly in ours' precision and
        ``exact`` a float64 one; the factor and the slack are stated by each caller.
    max_abs_error(a, b), norm_relative_error(a, b), max_relative_error(a, b)
        in float64: max |a - b|; ||a - b|| / ||b||; max |a - b| / max |b| (the last two: a zero b
        counts as 1e-300, so that any error against it is huge; NaN stays NaN).
    random_qkv(B, H, N, M, D, Dv, ...) -> (q, k, v[, grad_out])
        the op's inputs: independent N(0, 1) draws from one seeded generator, in a fixed order.
    split_heads(x, heads): (T, B, E) -> (B, heads, T, E // heads), as the modules split them.
    future_mask(T, S=None, ...): fairseq's additive future mask (-inf above the diagonal; with
        S > T keys the queries are the last T positions).
    padding_mask(lengths, T, left): a (B, T) key padding mask, True where padded.
    single_thread(): one torch thread inside the block (many small calls), then the count it found.

It imports only torch: ``tests/cuda/emulation/run_emulated_check.py`` imports it before the
package (which must not load the real extension there).
"""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch

# ----------------------------------------------------------------------------- the tolerance rule


def max_abs_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|, in float64."""
    return (a.detach().double() - b.detach().double()).abs().max().item()


def norm_relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (Frobenius), in float64; ||b|| = 0 counts as 1e-300."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def max_relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in float64; max |b| = 0 counts as 1e-300; 0 for empty tensors."""
    a, b = a.detach().double(), b.detach().double()
    if b.numel() == 0:
        return 0.0
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def check_against_plain(ours, plain, exact, what: str, atol: float, factor: float = 2.0) -> None:
    """ours is within ``factor`` times the plain same-precision computation's error of the float64
    one, plus ``atol`` (all three as tensors of one shape; max absolute errors)."""
    err, base = max_abs_error(ours, exact), max_abs_error(plain, exact)
    assert err <= factor * base + atol, f"{what}: error {err:.3e} > {factor:g} x {base:.3e} + {atol:.1e}"


# ----------------------------------------------------------------------------- inputs


def random_qkv(B: int, H: int, N: int, M: int, D: int, Dv: int, *, seed: int = 0,
               generator: Optional[torch.Generator] = None, dtype: torch.dtype = torch.float32,
               to: Optional[torch.dtype] = None, scale: float = 1.0, grad_out: bool = False,
               requires_grad: bool = False):
    """q (B, H, N, D), k (B, H, M, D), v (B, H, M, Dv) and, with ``grad_out``, an output
    gradient (B, H, N, Dv): independent N(0, 1) draws in that order, made in ``dtype`` from
    ``generator`` (which then goes on for the caller's further draws) or from a new one seeded
    with ``seed``; q and k times ``scale``; then cast to ``to`` (default: kept in ``dtype``);
    with ``requires_grad``, q, k and v are leaves that require grad. Returns a tuple."""
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g, dtype=dtype) * scale
    k = torch.randn(B, H, M, D, generator=g, dtype=dtype) * scale
    v = torch.randn(B, H, M, Dv, generator=g, dtype=dtype)
    out = [q, k, v]
    if grad_out:
        out.append(torch.randn(B, H, N, Dv, generator=g, dtype=dtype))
    if to is not None:
        out = [t.to(to) for t in out]
    if requires_grad:
        out[:3] = [t.requires_grad_() for t in out[:3]]
    return tuple(out)


# ----------------------------------------------------------------------------- layout and masks


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(T, B, E) -> (B, heads, T, E // heads): the modules' split of a projection into heads."""
    T, B, E = x.shape
    return x.view(T, B, heads, E // heads).permute(1, 2, 0, 3)


def future_mask(T: int, S: Optional[int] = None, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """fairseq's additive future mask (T, S): -inf where key j comes after query i (j > i + S - T)."""
    S = T if S is None else S
    return torch.triu(torch.full((T, S), float("-inf"), dtype=dtype, device=device), 1 + S - T)


def padding_mask(lengths: Sequence[int], T: int, left: bool) -> torch.Tensor:
    """(len(lengths), T) bool, True where padded: each sequence's padding on the left or the right."""
    pos = torch.arange(T).unsqueeze(0)
    n = torch.tensor(lengths).unsqueeze(1)
    return pos < (T - n) if left else pos >= n


@contextlib.contextmanager
def single_thread():
    """One torch thread for the block (many small calls: threads would only add overhead), then
    the count it found."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- non-finite inputs

#: where a case of nonfinite_case puts its NaN or infinity (docs/kernels.md, "NaN and infinity")
NONFINITE = ("q_nan", "q_inf", "k_nan", "k_neg_inf", "v_nan", "radius_nan", "radius_inf", "mask_nan",
             "mask_pos_inf", "padded_k_nan")


def nonfinite_case(where, N, causal):
    """(q, k, v, radius (H, D), grad_out, the op's and the oracle's keyword arguments): a NaN or an
    infinity at `where` (NONFINITE), in the inputs of N query rows, causal or not; the value sits in a
    key that the last row sees (a padded one for padded_k_nan: no row sees it)."""
    B, H, D, Dv = 2, 2, 6, 5
    M = 11 if N <= 9 else N + 5
    q, k, v, grad_out = random_qkv(B, H, N, M, D, Dv, seed=N, grad_out=True)
    radius = torch.full((H, D), 0.8)
    kwargs = dict(power=2, causal=causal)
    i, j = N - 1, M - 3  # a key the last row sees, causal or not
    value = {"nan": float("nan"), "inf": float("inf"), "neg_inf": float("-inf"), "pos_inf": float("inf")}[
        where.split("_", 1)[1] if not where.startswith("padded") else "nan"]
    if where.startswith("q"):
        q[1, 0, i, 2] = value
    elif where.startswith("k"):
        k[0, 1, j, 4] = value
    elif where.startswith("v"):
        v[1, 1, j, 0] = value
    elif where.startswith("radius"):
        radius[1, 3] = value
    elif where.startswith("mask"):
        mask = torch.zeros(N, M)
        mask[i, j] = value
        kwargs["attn_mask"] = mask
    else:  # a padded key's NaN: no row sees it
        k[0, 1, j, 4] = value
        padding = torch.zeros(B, M, dtype=torch.bool)
        padding[0, j] = True
        kwargs["key_padding_mask"] = padding
    return q, k, v, radius, grad_out, kwargs
