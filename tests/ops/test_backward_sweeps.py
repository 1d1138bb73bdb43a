"""The CPU backward over many keys (csrc/cpu/backward.inc), against the oracle.

The backward takes a group of query rows through two sweeps over the keys: the first takes the
forward's products for P and f dP of every key and sums Delta, the second makes g per element,
features outer and key blocks inner, summing it over the keys in registers. The fuzz
(test_op_fuzz.py) draws keys up to 100; here the cases of head dim 64 and 128 with their keys tiled
past 2^14 / D (256 keys at D 64, 128 at D 128: many key blocks per row group and feature; keys,
values, masks and padding repeated; causal rows then see the tiled keys their alignment gives
them; dropout's mask drawn again for the wider shape), forward and gradients against the float64
oracle, with the fuzz's bound (oracle.oracle_mismatches, stated in test_op_fuzz.py's docstring).
"""
from __future__ import annotations

import pytest
import torch

from fuzz_cases import _dropout_seed, draw_case
from helpers import single_thread
from oracle import oracle_mismatches

from fourierformer_fairseq.ops import backend_unavailable_reason, fourier_attention
from fourierformer_fairseq.ops.reference import dropout_keep_mask

pytestmark = pytest.mark.skipif(bool(backend_unavailable_reason("cpu")),
                                reason=f"fused CPU kernel: {backend_unavailable_reason('cpu')}")

MANY_KEYS_TIMES_D = 1 << 14  # keys past this over D


def tiled(case: dict, seed: int) -> dict:
    """The case with its keys (and values, masks, padding) repeated until they pass MANY_KEYS_TIMES_D / D."""
    k = case["k"]
    M, D = k.shape[2], k.shape[3]
    times = 1
    while M * times * D <= MANY_KEYS_TIMES_D:
        times += 1
    out = dict(case)
    out["k"] = k.repeat(1, 1, times, 1)
    out["v"] = case["v"].repeat(1, 1, times, 1)
    kwargs, oracle_kwargs = dict(case["kwargs"]), dict(case["oracle_kwargs"])
    for kw in (kwargs, oracle_kwargs):
        if kw.get("attn_mask") is not None:
            kw["attn_mask"] = kw["attn_mask"].repeat(*([1] * (kw["attn_mask"].dim() - 1)), times)
        if kw.get("key_padding_mask") is not None:
            kw["key_padding_mask"] = kw["key_padding_mask"].repeat(1, times)
    if kwargs.get("dropout_p"):
        B, H, N = case["q"].shape[:3]
        p = kwargs["dropout_p"]
        oracle_kwargs["dropout_scale"] = dropout_keep_mask(
            _dropout_seed(seed), (B, H, N, M * times), p, "cpu").double() / (1 - p)
    out.update(kwargs=kwargs, oracle_kwargs=oracle_kwargs, label=case["label"] + f" keys tiled x{times}")
    return out


def gradients(case):
    leaves = [case[n].clone().requires_grad_() for n in ("q", "k", "v", "radius")]
    with torch.random.fork_rng():
        torch.manual_seed(case.get("seed", 0))  # the dropout seed (fuzz_cases._dropout_seed)
        out = fourier_attention(*leaves, backend="cpu", **case["kwargs"])
    grads = torch.autograd.grad(out, leaves, case["grad_out"], allow_unused=True)
    return (out.detach(), *(torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)))


# fuzz seeds of head dim 64 and more, whose tiled keys stay a few hundred (at D 16 they would be
# over a thousand, where a float32 sum over the keys drifts past the fuzz's bound, calibrated to
# its own at most 100 keys, in the forward as much as in the backward): every case class, mask,
# radius shape and sign, the null key and dropout among them
SEEDS = [s for s in range(140) if draw_case(s)["k"].shape[3] >= 64]


def test_the_seeds_draw_every_class():
    from fuzz_cases import CLASSES, MASKS, case_classes

    drawn = [case_classes(s) for s in SEEDS]
    assert set(CLASSES) <= {c[0] for c in drawn} and set(MASKS) <= {c[1] for c in drawn}, drawn
    assert {c[4] for c in drawn} - {0.0} and {c[5] for c in drawn} - {0.0}, "no null key or no dropout"


@pytest.mark.parametrize("seed", SEEDS)
def test_many_keys_backward_against_oracle(seed):
    case = tiled(draw_case(seed), seed)
    M, D = case["k"].shape[2:]
    assert M * D > MANY_KEYS_TIMES_D
    with single_thread():
        bad = oracle_mismatches(gradients(case), *(case[n] for n in ("q", "k", "v", "radius", "grad_out")),
                                **case["oracle_kwargs"])
    assert not bad, case["label"] + "\n" + "\n".join(bad)
