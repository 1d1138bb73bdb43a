"""The Gaussian ablation's op takes ``fourier_attention``'s arguments: ``normaliser_eps`` only as 0.

Its scores drop a per-row constant (ops/gaussian.py), so the published normaliser's null key of
weight eps has no fixed meaning there; the op refuses eps > 0 with a message that says so, rather
than ignoring it, and validates it as ``fourier_attention`` does.
"""
import pytest
import torch

from fourierformer_fairseq.ops.gaussian import gaussian_attention
from helpers import random_qkv


def _inputs():
    q, k, v = random_qkv(1, 2, 3, 3, 4, 4, dtype=torch.float64)
    return q, k, v, torch.tensor(0.5, dtype=torch.float64)


def test_gaussian_refuses_a_published_normaliser():
    with pytest.raises(ValueError, match=r"gaussian_attention takes normaliser_eps=0, got 1e-06: its scores drop"):
        gaussian_attention(*_inputs(), power=2, normaliser_eps=1e-6)


def test_gaussian_validates_the_normaliser_as_fourier_attention_does():
    with pytest.raises(ValueError, match="normaliser_eps must be finite and >= 0"):
        gaussian_attention(*_inputs(), power=2, normaliser_eps=-1.0)


def test_gaussian_takes_a_zero_normaliser():
    out = gaussian_attention(*_inputs(), power=2, normaliser_eps=0.0)
    assert out.shape == (1, 2, 3, 4) and torch.isfinite(out).all()
