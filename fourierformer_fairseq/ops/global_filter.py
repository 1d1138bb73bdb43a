"""Global-filter token mixing (GFNet, Rao et al., NeurIPS 2021) for sequences: a learnable long
convolution per channel, computed by FFT in O(N log N).

The filter is kept in the time domain, one tap per lag, so that one parameter serves every
sequence length up to its own: ``taps`` (channels, L) holds the lags 0 .. L-1 of a causal filter,
(channels, 2L - 1) the lags -(L-1) .. L-1 of a non-causal one (lag 0 at index L - 1). A sequence
of N <= L positions uses the lags -(N-1) .. N-1 (causal: 0 .. N-1), transformed at run time.

    y[b, c, i] = sum_j h_c[i - j] x[b, c, j]      (j over 0 .. N-1; causal: j <= i)

is a linear, not circular, convolution: the lags are laid out on an FFT of size n >= 2N (a power
of two), negative lags wrapped to the end, so no output mixes positions that wrap around.
Computed in float32 for half inputs (float64 for float64).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def fft_size(n_positions: int) -> int:
    """The FFT size for N positions: the smallest power of two >= 2N."""
    return 1 << max(1, (2 * n_positions - 1).bit_length())


def max_lags(taps: Tensor, causal: bool) -> int:
    """The longest sequence ``taps`` serves: L (causal, L taps) or L (non-causal, 2L - 1 taps)."""
    return taps.size(-1) if causal else (taps.size(-1) + 1) // 2


def filter_kernel(taps: Tensor, n_positions: int, n: int, causal: bool) -> Tensor:
    """The lags a sequence of N positions uses, laid out for a circular FFT of size n >= 2N - 1:
    lag m >= 0 at index m, lag -m at index n - m. (channels, n)."""
    N = n_positions
    C = taps.size(0)
    if causal:
        return torch.cat([taps[:, :N], taps.new_zeros(C, n - N)], dim=-1)
    center = (taps.size(-1) - 1) // 2
    positive = taps[:, center:center + N]  # lags 0 .. N-1
    negative = taps[:, center - (N - 1):center]  # lags -(N-1) .. -1
    return torch.cat([positive, taps.new_zeros(C, n - (2 * N - 1)), negative], dim=-1)


def global_filter(x: Tensor, taps: Tensor, causal: bool, key_padding_mask: Optional[Tensor] = None) -> Tensor:
    """y[b, c, i] = sum_j h_c[i - j] x[b, c, j] for x (batch, channels, N); see the module docstring.

    key_padding_mask (batch, N), True = padded: those positions are zeroed before the transform
    (so they contribute nothing) and in the output.
    """
    N = x.size(-1)
    if N > max_lags(taps, causal):
        raise ValueError(
            f"the global filter serves sequences of at most {max_lags(taps, causal)} positions "
            f"(max_positions), got {N}"
        )
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc = x.to(compute)
    if key_padding_mask is not None:
        xc = xc.masked_fill(key_padding_mask.unsqueeze(1), 0.0)
    n = fft_size(N)
    device_type = x.device.type if x.device.type in ("cuda", "cpu") else "cpu"
    with torch.autocast(device_type=device_type, enabled=False):
        kernel = torch.fft.rfft(filter_kernel(taps.to(compute), N, n, causal), n=n)
        y = torch.fft.irfft(torch.fft.rfft(xc, n=n) * kernel, n=n)[..., :N]
    if key_padding_mask is not None:
        y = y.masked_fill(key_padding_mask.unsqueeze(1), 0.0)
    return y.to(x.dtype)


def global_filter_step(history: Tensor, taps: Tensor, n_new: int) -> Tensor:
    """The causal filter's output at the last ``n_new`` of T positions, by the direct sum over the
    history (batch, channels, T): O(T) per position and channel, what incremental decoding needs.
    Returns (batch, channels, n_new)."""
    T = history.size(-1)
    if T > taps.size(-1):
        raise ValueError(f"the global filter serves sequences of at most {taps.size(-1)} positions "
                         f"(max_positions), got {T}")
    compute = torch.float64 if history.dtype == torch.float64 else torch.float32
    positions = torch.arange(T - n_new, T, device=history.device).unsqueeze(1)  # (n_new, 1)
    lags = positions - torch.arange(T, device=history.device).unsqueeze(0)  # (n_new, T)
    h = taps.to(compute)[:, lags.clamp(min=0)] * (lags >= 0).to(compute)  # (channels, n_new, T)
    y = torch.einsum("cit,bct->bci", h, history.to(compute))
    return y.to(history.dtype)


__all__ = ["fft_size", "filter_kernel", "global_filter", "global_filter_step", "max_lags"]
