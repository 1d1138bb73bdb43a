"""Seeded fuzz of the CUDA op against the float64 oracle (tests/oracle.py); needs a GPU.

The cases are the CPU fuzz's (tests/fuzz_cases.py: draw_case): every remainder of N and M,
exact and near duplicates (q == k, 1e-6, 1e-3), keys on and next to sinc's zeros, large |R q|,
powers 2, 4, 6 and the odd powers 1, 3, 5 (signed weights), every radius shape, causal, key padding (fully padded sequences too), additive
and bool masks; the forward and all four gradients are checked, in every dtype the CUDA
kernels take.

Bounds, per tensor of (out, dq, dk, dv, dradius):
- float32: the CPU fuzz's, max |ours - oracle| <= 4 max |plain - oracle| + 16 eps32 scale + 1e-30
  (plain: the formula in float32 with plain autograd; scale: the largest sum of absolute values
  of the terms one element sums; tests/oracle.py).
- float16 / bfloat16: the kernels read half-precision inputs, compute in float32 and round what
  they return to the input dtype (the radius and its gradient stay float32). The oracle runs on
  the inputs rounded to that dtype, and the bound is the float32 one plus the rounding of the
  result: + eps_dtype * (max |oracle| + tiny_dtype) for out, dq, dk, dv (tiny: the smallest
  normal number, so eps * tiny is the spacing of the subnormals, where float16 gradients of
  duplicate keys land).
- float64: within 1e-9 scale of the oracle (as the CPU float64 kernel).

phi = sigmoid: the fuzz's draws (tests/fuzz_cases.py, shared with the CPU fuzz) give it to no case, so
every fourth case runs again with phi = sigmoid in place of its own (sigmoid_case), within the same
bounds, with and without the score cache and on split grids too.
"""
from __future__ import annotations


import pytest
import torch

from oracle import (EPS32, NAMES, PLAIN_FACTOR, SCALE_FACTOR, UNDERFLOW, float64_mismatches, oracle_mismatches,  # noqa: E402
                    lse_mismatches, oracle_gradient_scales, oracle_gradients, plain_gradients)
from fuzz_cases import case_classes, median_row_mass, op_forward_args  # noqa: E402
from fuzz_cases import draw_case as draw_any_case  # noqa: E402

from fourierformer_fairseq.ops import DECLARATIONS, backend_unavailable_reason, fourier_attention  # noqa: E402

_reason = backend_unavailable_reason("cuda")
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(bool(_reason), reason=f"CUDA kernels: {_reason}")]

N_CASES = 140
# the phis the CUDA kernels run (the fuzz draws |x| and ReLU too: DECLARATIONS["cuda"].phis lists them)
CUDA_PHIS = DECLARATIONS["cuda"].phis or ("power",)


def runs_on_cuda(kind):
    """Whether the CUDA kernels run the fuzz's phi kind: a phi they list, or "odd" (phi "power" with p
    1, 3 or 5) where their power rule takes odd p (power_multiple 1)."""
    if kind == "odd":
        return "power" in CUDA_PHIS and DECLARATIONS["cuda"].power_multiple == 1
    return kind in CUDA_PHIS


def draw_case(seed):
    """The fuzz case of `seed` where its phi runs on CUDA; a skip naming it otherwise."""
    phi = case_classes(seed)[6]
    if not runs_on_cuda(phi):
        pytest.skip(f"phi={phi!r}: the CUDA kernels run {CUDA_PHIS} with {DECLARATIONS['cuda'].power_rule}")
    return draw_any_case(seed)
# every fourth fuzz case again with phi = sigmoid (sigmoid_case)
SIGMOID_SEEDS = range(0, N_CASES, 4)


def sigmoid_case(seed):
    """Fuzz case `seed` with phi = sigmoid (power 1) in place of its own phi; the null key's eps taken
    anew from sigmoid's median row mass, as draw_case takes it for the case's own phi."""
    case = draw_any_case(seed)
    kwargs = {k: v for k, v in case["kwargs"].items() if k not in ("phi", "normaliser_eps")}
    kwargs.update(phi="sigmoid", power=1)
    eps_factor = case_classes(seed)[4]
    if eps_factor:
        kwargs["normaliser_eps"] = eps_factor * median_row_mass(case["q"], case["k"], case["radius"], kwargs)
    oracle_kwargs = {k: v for k, v in kwargs.items() if k != "dropout_p"}
    if "dropout_scale" in case["oracle_kwargs"]:
        oracle_kwargs["dropout_scale"] = case["oracle_kwargs"]["dropout_scale"]
    return dict(case, kwargs=kwargs, oracle_kwargs=oracle_kwargs, label=case["label"] + " with phi=sigmoid")


# Where the tests run: on CPU, tests/cuda/test_cuda_harness_on_cpu.py runs some of them through the
# CPU kernels, so that a mistake of the harness shows without a GPU.
DEVICE, BACKEND = "cuda", "cuda"
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _rounded(case, dtype):
    """The case with q, k, v, grad_out rounded to dtype (float32 otherwise), radius float32."""
    out = dict(case)
    for n in ("q", "k", "v", "grad_out"):
        out[n] = case[n].to(dtype).float()
    out["radius"] = case["radius"].float()
    return out


def cuda_gradients(case, dtype):
    dev = torch.device(DEVICE)
    leaves = [case[n].to(dev, dtype).clone().requires_grad_() for n in ("q", "k", "v")]
    radius = case["radius"].to(dev, torch.float64 if dtype == torch.float64 else torch.float32).clone().requires_grad_()
    kwargs = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in case["kwargs"].items()}
    with torch.random.fork_rng():
        torch.manual_seed(case.get("seed", 0))  # the dropout seed, as the oracle's factors take it
        out = fourier_attention(*leaves, radius, backend=BACKEND, **kwargs)
    grads = torch.autograd.grad(out, leaves + [radius], case["grad_out"].to(dev, dtype), allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves + [radius])]
    return tuple(t.detach().cpu() for t in (out, *grads))


def _args(case):
    return [case[n] for n in ("q", "k", "v", "radius", "grad_out")]


def _within_oracle(case, ours):
    bad = oracle_mismatches(ours, *_args(case), **case["oracle_kwargs"])
    assert not bad, case["label"] + "\n" + "\n".join(bad)


def _both_ways(monkeypatch, case, env, value):
    """The float32 results with the environment variable `env` unset and set to `value`, each
    within the oracle's bound."""
    runs = []
    for setting in (None, value):
        if setting is None:
            monkeypatch.delenv(env, raising=False)
        else:
            monkeypatch.setenv(env, setting)
        runs.append(cuda_gradients(case, torch.float32))
        _within_oracle(case, runs[-1])
    return runs


def _assert_alike(case, first, second, rel, what, exact=()):
    """first and second agree: the outputs named in `exact` bit for bit, the others within `rel`
    of the largest |second| (or 1)."""
    for name, a, b in zip(NAMES, first, second):
        if name in exact:
            assert torch.equal(a, b), f"{case['label']}: {name} differs {what}"
            continue
        scale = max(1.0, b.abs().max().item()) if b.numel() else 1.0
        err = (a - b).abs().max().item() if a.numel() else 0.0
        assert err <= rel * scale, f"{case['label']}: {name} differs by {err:.3e} {what}"


@pytest.mark.parametrize("seed", range(N_CASES))
def test_cuda_fuzz_float32_against_oracle(seed):
    case = _rounded(draw_case(seed), torch.float32)
    bad = oracle_mismatches(cuda_gradients(case, torch.float32), *_args(case), **case["oracle_kwargs"])
    assert not bad, case["label"] + "\n" + "\n".join(bad)


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("seed", range(0, N_CASES, 2))
def test_cuda_fuzz_half_against_oracle(seed, dtype):
    dt = HALF[dtype]
    case = _rounded(draw_case(seed), dt)
    args, kwargs = _args(case), case["oracle_kwargs"]
    ours = cuda_gradients(case, dt)
    exact = oracle_gradients(*args, **kwargs)
    plain = plain_gradients(*args, **kwargs)
    scales = oracle_gradient_scales(*args, **kwargs)
    bad = []
    for name, a, x, pl, scale in zip(NAMES, ours, exact, plain, scales):
        if not torch.isfinite(a).all():
            bad.append(f"{name}: not finite")
            continue
        if a.numel() == 0:
            continue
        err = (a.double() - x).abs().max().item()
        perr = (pl.double() - x).abs().max().item()
        # rounding to dt: half an ulp of the largest value, or of the subnormals (float16's are
        # 2^-24 apart: a gradient of 1e-8 there rounds to 0 or 6e-8)
        fi = torch.finfo(dt)
        rounding = fi.eps * (x.abs().max().item() + fi.tiny) if name != "dradius" else 0.0
        bound = PLAIN_FACTOR * perr + SCALE_FACTOR * EPS32 * scale + UNDERFLOW + rounding
        if not err <= bound:
            bad.append(f"{name}: error {err:.3e} > 4 x plain {perr:.3e} + 16 eps32 x scale {scale:.3e} "
                       f"+ {dtype} rounding {rounding:.3e}")
    assert not bad, f"{dtype} " + case["label"] + "\n" + "\n".join(bad)


@pytest.mark.parametrize("seed", range(0, N_CASES, 5))
def test_cuda_fuzz_float64_against_oracle(seed):
    case = draw_case(seed)
    case = {**case, **{n: case[n].double() for n in ("q", "k", "v", "radius", "grad_out")}}
    bad = float64_mismatches(cuda_gradients(case, torch.float64), *_args(case), **case["oracle_kwargs"])
    assert not bad, case["label"] + "\n" + "\n".join(bad)


@pytest.mark.parametrize("seed", SIGMOID_SEEDS)
def test_cuda_fuzz_sigmoid_float32_against_oracle(seed):
    case = _rounded(sigmoid_case(seed), torch.float32)
    _within_oracle(case, cuda_gradients(case, torch.float32))


@pytest.mark.parametrize("seed", range(0, N_CASES, 20))
def test_cuda_fuzz_sigmoid_float64_against_oracle(seed):
    case = sigmoid_case(seed)
    case = {**case, **{n: case[n].double() for n in ("q", "k", "v", "radius", "grad_out")}}
    bad = float64_mismatches(cuda_gradients(case, torch.float64), *_args(case), **case["oracle_kwargs"])
    assert not bad, case["label"] + "\n" + "\n".join(bad)


def test_cuda_sigmoid_score_cache_and_grid_splits(monkeypatch):
    """phi = sigmoid's own instances of the tiled backward's main pass (with the score cache too: its
    g pass takes sigmoid's derivative) and of its two-half pre-pass: the first four sigmoid cases
    with and without the score cache, and the first three with D >= 64 split and whole, within the
    oracle's bound and alike as in the tests above."""
    for seed in list(SIGMOID_SEEDS)[:4]:
        case = _rounded(sigmoid_case(seed), torch.float32)
        cached, recomputed = _both_ways(monkeypatch, case, "FOURIERFORMER_SCORE_CACHE_MB", "0")
        _assert_alike(case, cached, recomputed, 1e-6, "with and without the cache")
    monkeypatch.delenv("FOURIERFORMER_SCORE_CACHE_MB", raising=False)
    seeds = [s for s in SIGMOID_SEEDS if draw_any_case(s)["q"].shape[-1] >= 64][:3]
    assert seeds, "no sigmoid case with head dim 64 or more"
    for seed in seeds:
        case = _rounded(sigmoid_case(seed), torch.float32)
        split, whole = _both_ways(monkeypatch, case, "FOURIERFORMER_GRID_SPLITS", "1")
        _assert_alike(case, split, whole, 1e-5, "with the grid split (two-half pre-pass)")


def test_cuda_score_cache_on_and_off_agree(monkeypatch):
    """The float32 backward's main pass reads the pre-pass's cached scores (within the budget; rows
    of M rounded up to a multiple of 4) or, with FOURIERFORMER_SCORE_CACHE_MB=0, computes them
    again: both within the oracle's bound, and alike (the same P; dq's float atomics may add in
    another order). Cases with M a multiple of 4 and not."""
    by_rest = [[s for s in range(N_CASES) if case_classes(s)[6] in CUDA_PHIS and (draw_any_case(s)["k"].shape[-2] % 4 == 0) == whole][:4] for whole in (True, False)]
    assert all(by_rest), "no fuzz case with M a multiple of 4, or none with another M"
    for seed in by_rest[0] + by_rest[1]:
        case = _rounded(draw_case(seed), torch.float32)
        cached, recomputed = _both_ways(monkeypatch, case, "FOURIERFORMER_SCORE_CACHE_MB", "0")
        _assert_alike(case, cached, recomputed, 1e-6, "with and without the cache")


def test_cuda_grid_splits_and_whole_agree(monkeypatch):
    """Where its grid is small (these cases': a few tiles against the GPU's resident blocks), the
    float32 backward with the score cache splits its work: the main pass each key tile's features
    over up to four blocks (main_pass_splits, D >= 32), the pre-pass into two halves of a block
    (delta_pass_split, padded D >= 64); FOURIERFORMER_GRID_SPLITS=1 splits nothing. Both within
    the oracle's bound and alike: with the main pass split alone dk and dv bit for bit (the same
    sums), dq and dradius to float atomics' order (1e-6 relative); with the two-half pre-pass
    within 1e-5 relative (its halves round the scores otherwise: |S| eps32 in P). The cases: the
    first six fuzz cases with D >= 64 as drawn, and cut to their first 40 features (Dp 40: the
    main pass split alone)."""
    seeds = [s for s in range(N_CASES) if case_classes(s)[6] in CUDA_PHIS and draw_any_case(s)["q"].shape[-1] >= 64][:6]
    assert seeds, "no fuzz case with head dim 64 or more"
    for seed, cut in [(s, c) for s in seeds for c in (False, True)]:
        case = _rounded(draw_case(seed), torch.float32)
        if cut:
            D = case["q"].shape[-1]
            case["q"], case["k"] = case["q"][..., :40].contiguous(), case["k"][..., :40].contiguous()
            if case["radius"].dim() and case["radius"].shape[-1] == D:
                case["radius"] = case["radius"][..., :40].contiguous()
        halves = -(-case["q"].shape[-1] // 8) * 8 >= 64
        split, whole = _both_ways(monkeypatch, case, "FOURIERFORMER_GRID_SPLITS", "1")
        if halves:
            _assert_alike(case, split, whole, 1e-5, "with the grid split (two-half pre-pass)")
        else:
            _assert_alike(case, split, whole, 1e-6, "with the main pass split", exact=("dk", "dv"))


def test_cuda_repeated_runs_agree():
    """The same call run again gives the same results: out, dk and dv bit for bit (each element is
    written by one block), dq and dradius to float atomics' order (1e-6 relative). A GPU runs the
    blocks of a launch in no fixed order, so a result that depends on the order (two blocks writing
    one word; a block reading what another block of the same launch writes, e.g. a main-pass split
    copying dv before split 0 has summed it) shows as runs that differ (the host emulator's
    check_block_order runs the blocks last to first for the same reason). The cases: the first three
    fuzz cases with D >= 64, where the small-grid splits put several blocks on one key tile, five
    runs each."""
    seeds = [s for s in range(N_CASES) if case_classes(s)[6] in CUDA_PHIS and draw_any_case(s)["q"].shape[-1] >= 64][:3]
    assert seeds, "no fuzz case with head dim 64 or more"
    for seed in seeds:
        case = _rounded(draw_case(seed), torch.float32)
        runs = [cuda_gradients(case, torch.float32) for _ in range(5)]
        _within_oracle(case, runs[0])
        for other in runs[1:]:
            _assert_alike(case, other, runs[0], 1e-6, "between two runs of one call", exact=("out", "dk", "dv"))


def test_cuda_autograd_builds_the_tables_once(monkeypatch):
    """The autograd builds the float32 path's tables once per step (fourier_attention_tables) and
    keeps them for the backward: among the saved tensors a float32 vector of
    _C.cuda_table_floats(B, H, N, M, D) elements where D and Dv are within the tiled backward's
    limit; none with FOURIERFORMER_KEEP_TABLES=0. The gradients agree either way (dq's and
    dradius's float atomics may add in another order) and are within the oracle's bound."""
    from fourierformer_fairseq.ops import DECLARATIONS
    from fourierformer_fairseq.ops.extension import extension_status

    limit = DECLARATIONS["cuda"].tiled_backward_max_head_dim
    for seed in range(6):
        case = _rounded(draw_case(seed), torch.float32)
        B, H, N, D = case["q"].shape
        M, Dv = case["k"].shape[2], case["v"].shape[-1]
        floats = extension_status().module.cuda_table_floats(B, H, N, M, D)
        results = {}
        for keep in ("1", "0"):
            monkeypatch.setenv("FOURIERFORMER_KEEP_TABLES", keep)
            saved = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
                results[keep] = cuda_gradients(case, torch.float32)
            kept = [t for t in saved if t.dtype == torch.float32 and t.dim() == 1 and t.numel() == floats]
            expected = 1 if keep == "1" and max(D, Dv) <= limit else 0
            assert len(kept) == expected, f"{case['label']}: {len(kept)} tables kept with KEEP_TABLES={keep}"
        for ours in results.values():
            _within_oracle(case, ours)
        _assert_alike(case, results["1"], results["0"], 1e-6, "with and without kept tables")


def test_cuda_fuzz_lse_against_oracle():
    """The float32 forward's log-normaliser (the tables' row and key constants enter it, and the
    backward and the null key read it) on every fuzz case against the oracle's log-sum, within
    lse_mismatches' bound (as tests/ops/test_op_fuzz.py does for the CPU kernels)."""
    failures = []
    for seed in range(N_CASES):
        case = _rounded(draw_case(seed), torch.float32)
        _, lse = torch.ops.fourierformer.fourier_attention_forward(*op_forward_args(case, torch.float32, DEVICE))
        bad = lse_mismatches(lse, case["q"], case["k"], case["radius"], **case["kwargs"])
        failures += [case["label"] + ": " + b for b in bad]
    assert not failures, "\n".join(failures)
