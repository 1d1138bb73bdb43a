"""scripts/analysis/dynamics/published_init.py: the measurements of docs/published-model.md on inputs whose answers
are known in closed form."""

import pytest
import torch

from repo import load


@pytest.fixture(scope="module")
def pub():
    return load("scripts/analysis/dynamics/published_init.py")


def test_equal_queries_and_keys_give_uniform_rows_and_the_eps_share_of_a_count(pub):
    # q std 0: every q equals every k, every weight is sinc(0)^p = 1, row i sums i + 1 keys
    N = 8
    r = pub.measure(0.0, 4, R=2.0, p=4, N=N, B=1, H=1, g=torch.Generator().manual_seed(0))
    counts = torch.arange(N // 2, N, dtype=torch.float64) + 1  # the rows kept: N/2 .. N-1
    assert r["row sum"] == counts.median().item()
    assert r["eps mass mean"] == pytest.approx((1e-6 / (counts + 1e-6)).mean().item(), rel=1e-12)
    assert r["entropy"] == pytest.approx(counts.log().mean().item(), rel=1e-12)  # uniform rows
    assert r["past zero"] == 0 and r["overflow"] == 0


def test_large_queries_are_past_sincs_first_zero_and_overflow_with_the_radius_factor(pub):
    r = pub.measure(100.0, 32, R=3.0, p=4, N=8, B=1, H=1, g=torch.Generator().manual_seed(0))
    assert r["past zero"] == 1.0  # |R (q - k)| >> pi in some feature of every pair
    # the diagonal pairs (q_i, k_i independent) are not equal, so sinc factors are tiny: no overflow
    assert r["overflow"] == 0
    r = pub.measure(0.0, 32, R=3.0, p=4, N=8, B=1, H=1, g=torch.Generator().manual_seed(0))
    assert 3.0 ** (32 * 4) > torch.finfo(torch.float32).max and r["overflow"] == 1.0
