"""The CUDA fuzz's harness (tests/cuda/test_cuda_fuzz.py) run through the CPU kernels.

The CUDA tests run only where a GPU is lent, and rarely; a mistake of their own (a keyword the
oracle does not take, a dropout seed drawn otherwise than the oracle's factors assume, a case
selection that holds no case) would cost that run. Here the same test functions run with
DEVICE = BACKEND = "cpu": what they check of the kernels then holds for the CPU kernels, and what
they do themselves is exercised. The environment variables they set (FOURIERFORMER_SCORE_CACHE_MB,
FOURIERFORMER_GRID_SPLITS) do nothing on CPU, so their two runs must agree exactly there.
"""
from __future__ import annotations


import pytest
import torch

import test_cuda_fuzz as harness  # noqa: E402
from fuzz_cases import draw_case  # noqa: E402

from fourierformer_fairseq.ops import backend_unavailable_reason  # noqa: E402

_reason = backend_unavailable_reason("cpu")
pytestmark = pytest.mark.skipif(bool(_reason), reason=f"CPU kernels: {_reason}")

# every case class of the fuzz's first nine seeds: dropout (3, 4, 5), the null key, masks
SEEDS = range(9)


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setattr(harness, "DEVICE", "cpu")
    monkeypatch.setattr(harness, "BACKEND", "cpu")


def test_the_seeds_hold_dropout_and_the_null_key():
    kwargs = [draw_case(s)["kwargs"] for s in SEEDS]
    assert any("dropout_p" in k for k in kwargs) and any(k.get("normaliser_eps") for k in kwargs)


@pytest.mark.parametrize("seed", SEEDS)
def test_float32_fuzz_harness(seed):
    harness.test_cuda_fuzz_float32_against_oracle(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_float64_fuzz_harness(seed):
    harness.test_cuda_fuzz_float64_against_oracle(seed)


@pytest.mark.parametrize("seed", [s for s in SEEDS if s in harness.SIGMOID_SEEDS])
def test_sigmoid_fuzz_harness(seed):
    harness.test_cuda_fuzz_sigmoid_float32_against_oracle(seed)


def test_sigmoid_case_is_sigmoid_and_its_own_null_key():
    """sigmoid_case gives the op and the oracle phi = sigmoid with power 1, its dropout the case's,
    and a null key's eps of sigmoid's row mass (so that a case whose own phi is a power gets another)."""
    for seed in harness.SIGMOID_SEEDS[:6]:
        case, own = harness.sigmoid_case(seed), draw_case(seed)
        for kw in (case["kwargs"], case["oracle_kwargs"]):
            assert kw["phi"] == "sigmoid" and kw["power"] == 1
        assert ("dropout_p" in case["kwargs"]) == ("dropout_p" in own["kwargs"])
        assert ("dropout_scale" in case["oracle_kwargs"]) == ("dropout_scale" in own["oracle_kwargs"])
        if own["kwargs"].get("normaliser_eps"):
            assert case["kwargs"]["normaliser_eps"] != own["kwargs"]["normaliser_eps"]


def test_sigmoid_score_cache_and_grid_splits_harness(monkeypatch):
    harness.test_cuda_sigmoid_score_cache_and_grid_splits(monkeypatch)


def test_dropout_case_draws_the_oracles_mask():
    """The harness seeds the op's dropout as the oracle's factors assume: the gradients of a
    dropout case differ from those of another seed's draw (so the check above could fail)."""
    seed = next(s for s in SEEDS if "dropout_p" in draw_case(s)["kwargs"])
    case = harness._rounded(draw_case(seed), torch.float32)
    ours = harness.cuda_gradients(case, torch.float32)
    other = harness.cuda_gradients(dict(case, seed=seed + 1000), torch.float32)
    assert not torch.equal(ours[0], other[0])
    harness._within_oracle(case, ours)
    with pytest.raises(AssertionError):
        harness._within_oracle(case, other)


def test_score_cache_harness(monkeypatch):
    harness.test_cuda_score_cache_on_and_off_agree(monkeypatch)


def test_grid_splits_harness(monkeypatch):
    harness.test_cuda_grid_splits_and_whole_agree(monkeypatch)


def test_repeated_runs_harness():
    harness.test_cuda_repeated_runs_agree()


def test_lse_harness():
    harness.test_cuda_fuzz_lse_against_oracle()
