"""The phis of the paper's Table 7 besides the even powers, on the fused CPU backend, against the
independent float64 oracle (tests/oracle.py, keyword ``phi``).

phi(x) = |x| is the log domain with p = 1: S_ij = sum_d log|sinc(R_d (q_id - k_jd))| (the ops take it
as power 1); ReLU is the same with S_ij = -inf (a zero weight) wherever a factor's sinc is negative,
so that a row whose every visible key has one gives 0, as a row with every key masked; sigmoid has
S_ij = sum_d log sigmoid(sinc(R_d (q_id - k_jd))) (power 1 as well); x and x^3
(phi "power" with p 1 and 3, which the CUDA kernels run too) have signed weights prod_d sinc^p, normalised by
their signed sum plus eps, also where that sum is near 0 (the bound then grows with the plain
float32 implementation's error, which the cancellation amplifies as it does the kernels'). Each case checks the forward and the four gradients within oracle.oracle_mismatches'
bound (4 x the error of a plain float32 implementation of the same formula, plus 16 float32 eps
of the terms' scale), or within float64_mismatches' 1e-9 of the scale for the float64 kernel:
every mask kind (bool masks: the one-pass forward; finite additive masks: the log-domain forward),
every radius shape, dropout, the null key (normaliser_eps), short slices (fewer query rows than a
row group: the decoding forward) and need_weights. Inputs come from seeded generators. The
seeded fuzz (tests/ops/test_op_fuzz.py) draws each on every fourth pair of seeds, and its variant
re-runs take this file too.
"""
import math

import pytest
import torch

from fuzz_cases import RADIUS_SHAPES
from helpers import random_qkv, single_thread
from oracle import float64_mismatches, oracle_mismatches, oracle_weights

from fourierformer_fairseq.ops import (
    DECLARATIONS,
    backend_unavailable_reason,
    dropout_keep_mask,
    fourier_attention,
    fourier_attention_reference,
)
from fourierformer_fairseq.ops.reference import draw_seed

CPU_FUSED = not backend_unavailable_reason("cpu")
pytestmark = pytest.mark.skipif(not CPU_FUSED, reason=f"fused CPU kernel: {backend_unavailable_reason('cpu')}")

FUSED_CPU_PHIS = ("abs", "relu", "sigmoid")
FUSED_CUDA_PHIS = ("abs", "relu", "sigmoid")
# phi(x) = x^p with odd p (phi "power"): signed weights, normalised directly (the CPU and CUDA kernels)
ODD_POWERS = {"x": 1, "x^3": 3}
CPU_CASES = FUSED_CPU_PHIS + tuple(ODD_POWERS)


def phi_kwargs(name):
    """The op's keywords for a phi of CPU_CASES."""
    return dict(power=ODD_POWERS[name]) if name in ODD_POWERS else dict(phi=name)
MASK_KINDS = ("none", "causal", "padded", "causal_padded", "additive", "bool")


def make_radius(kind, H, D, value, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = {"scalar": (), "head": (H, 1), "feature": (D,), "head_feature": (H, D)}[kind]
    return value * (0.8 + 0.4 * torch.rand(shape, generator=g))


def mask_kwargs(mask_kind, B, H, N, M, seed=0):
    g = torch.Generator().manual_seed(seed)
    kwargs = {}
    if mask_kind.startswith("causal"):
        kwargs["causal"] = True
    if mask_kind.endswith("padded"):
        kpm = torch.zeros(B, M, dtype=torch.bool)
        kpm[-1, -(M // 3 + 1):] = True  # the last sequence right-padded
        kpm[0, :2] = True  # the first left-padded
        kwargs["key_padding_mask"] = kpm
    if mask_kind == "additive":  # finite values (the log-domain forward) and some -inf
        mask = torch.randn(N, M, generator=g) * 2
        mask[:, 1] = float("-inf")
        kwargs["attn_mask"] = mask
    if mask_kind == "bool":
        kwargs["attn_mask"] = torch.rand(B * H, N, M, generator=g) < 0.25
    return kwargs


def fused_and_grads(q, k, v, r, grad_out, dtype=torch.float32, seed=0, **kwargs):
    leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v, r)]
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # the dropout seed (dropout_seed)
        out = fourier_attention(*leaves, backend="cpu", **kwargs)
    grads = torch.autograd.grad(out, leaves, grad_out.to(dtype), allow_unused=True)
    return (out.detach(), *[torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)])


def dropout_seed(seed):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return draw_seed()


def oracle_keywords(kwargs, shape, seed):
    """The oracle's keywords for an op call: dropout as the factors of the kernels' own mask."""
    kwargs = dict(kwargs)
    p = kwargs.pop("dropout_p", 0.0)
    if p:
        kwargs["dropout_scale"] = dropout_keep_mask(dropout_seed(seed), shape, p, "cpu").double() / (1 - p)
    return kwargs


def check_against_oracle(q, k, v, r, grad_out, what, dtype=torch.float32, seed=0, **kwargs):
    B, H, N, _ = q.shape
    okw = oracle_keywords(kwargs, (B, H, N, k.shape[2]), seed)
    with single_thread():
        ours = fused_and_grads(q, k, v, r, grad_out, dtype=dtype, seed=seed, **kwargs)
    check = float64_mismatches if dtype == torch.float64 else oracle_mismatches
    bad = check(ours, q, k, v, r, grad_out, **okw)
    assert not bad, f"{what}: " + "; ".join(bad)


def draw(B, H, N, M, D, Dv, seed, std=1.0):
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    return q * std, k * std, v, torch.randn(B, H, N, Dv, generator=g)


@pytest.mark.parametrize("phi", FUSED_CPU_PHIS)
def test_phi_declarations_take_it_where_it_runs(phi):
    """The CPU backend declares every phi here, the CUDA backend those of FUSED_CUDA_PHIS (|x|, ReLU and
    sigmoid): a backend gives a reason about phi exactly where it does not run it."""
    assert phi in DECLARATIONS["cpu"].phis and (phi in DECLARATIONS["cuda"].phis) == (phi in FUSED_CUDA_PHIS)
    q = torch.zeros(1, 1, 2, 4)
    from fourierformer_fairseq.ops.inputs import prepare_inputs

    inp = prepare_inputs(q, q, q, torch.tensor(1.0), phi=phi)
    assert DECLARATIONS["cpu"].not_supported_reasons(inp) == []
    cuda_refuses = any("phi" in r for r in DECLARATIONS["cuda"].not_supported_reasons(inp))
    assert cuda_refuses == (phi not in FUSED_CUDA_PHIS)


@pytest.mark.parametrize("phi", CPU_CASES)
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("radius_kind", RADIUS_SHAPES)
def test_phi_every_mask_and_radius_shape_against_the_oracle(radius_kind, mask_kind, phi):
    # N = 19 and M = 37 leave a remainder in every row group and lane width; Dv = 37 a tail
    B, H, N, M, D, Dv = 2, 2, 19, 37, 16, 37
    seed = 7 * RADIUS_SHAPES.index(radius_kind) + MASK_KINDS.index(mask_kind)
    q, k, v, grad_out = draw(B, H, N, M, D, Dv, seed)
    r = make_radius(radius_kind, H, D, 1.5, seed)
    check_against_oracle(q, k, v, r, grad_out, f"{phi} {radius_kind} {mask_kind}", **phi_kwargs(phi),
                         **mask_kwargs(mask_kind, B, H, N, M, seed))


@pytest.mark.parametrize("phi", CPU_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", ["dropout", "null_key", "dropout_null_key_causal", "short", "short_additive",
                                  "wide_radius", "duplicates", "head_dim_128"])
def test_phi_options_and_paths_against_the_oracle(case, dtype, phi):
    B, H, N, M, D, Dv = 2, 2, 19, 37, 16, 9
    if case.startswith("short"):  # fewer rows than a row group: the short-query forward
        N = 3
    if case == "head_dim_128":
        D = 128
    seed = 100 + len(case)
    q, k, v, grad_out = draw(B, H, N, M, D, Dv, seed)
    r = make_radius("head_feature", H, D, 3.0 if case == "wide_radius" else 1.0, seed)
    kwargs = phi_kwargs(phi)
    if case == "duplicates":  # queries equal to keys (the floors of the exact step)
        q = k[:, :, :N].clone()
    if case.startswith("dropout"):
        kwargs["dropout_p"] = 0.3
    if "null_key" in case:
        kwargs["normaliser_eps"] = 1e-3
    if case.endswith("causal"):
        kwargs["causal"] = True
    if case == "short_additive":
        kwargs.update(mask_kwargs("additive", B, H, N, M, seed))
    check_against_oracle(q, k, v, r, grad_out, f"{phi} {case}", dtype=dtype, seed=seed, **kwargs)


@pytest.mark.parametrize("phi", CPU_CASES)
def test_phi_need_weights_against_the_oracle(phi):
    B, H, N, M, D, Dv = 1, 2, 11, 21, 8, 4
    q, k, v, _ = draw(B, H, N, M, D, Dv, 5)
    r = make_radius("head", H, D, 1.2, 5)
    kwargs = dict(phi_kwargs(phi), causal=True)
    _, weights = fourier_attention(q, k, v, r, need_weights=True, backend="cpu", **kwargs)
    exact = oracle_weights(q, k, r, **kwargs)
    plain = oracle_weights(q.float(), k.float(), r.float(), **kwargs)  # (float64 inside: the bound's floor)
    err = (weights.double() - exact).abs().max().item()
    # (signed weights, x and x^3: each weight's error also carries its row's normaliser's, whose
    # relative error its terms' times c_i = sum_j |P_ij| give; 1 for weights of one sign)
    scale = max(1.0, (exact.abs() * exact.abs().sum(-1, keepdim=True)).max().item())
    assert err <= 64 * 2.0**-24 * scale + 4 * (plain - exact).abs().max().item(), err


@pytest.mark.parametrize("phi", CPU_CASES)
def test_phi_reference_equals_the_oracle(phi):
    # the reference is the source of truth the kernels stand in for: it and the oracle agree
    B, H, N, M, D, Dv = 2, 2, 5, 9, 6, 3
    q, k, v, grad_out = (t.double() for t in draw(B, H, N, M, D, Dv, 11))
    r = make_radius("feature", H, D, 1.3, 11).double()
    ref = fourier_attention_reference(q, k, v, r, causal=True, **phi_kwargs(phi))
    from oracle import oracle_attention

    exact = oracle_attention(q, k, v, r, causal=True, **phi_kwargs(phi))
    assert (ref - exact).abs().max().item() < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("path", ["one_pass", "additive", "short"])
def test_phi_relu_rows_of_zero_weights_give_zero_and_zero_gradients(path, dtype):
    # R = 3 with unit-variance q and k: many keys have a factor below 0, and every key has one in
    # the first query row (feature 0 of every key at 0, the row's at 1.5: x = 4.5, in (pi, 2 pi)):
    # that row's output, its lse and every gradient it feeds are 0 (+inf for the lse), as a row
    # with every key masked; the others match the oracle, on each forward path
    B, H, N, M, D, Dv = 1, 2, 3 if path == "short" else 12, 20, 4, 5
    q, k, v, grad_out = draw(B, H, N, M, D, Dv, 21)
    k[..., 0] = 0.0
    q[:, :, 0, 0] = 1.5
    r = torch.tensor(3.0)
    kwargs = dict(phi="relu")
    if path == "additive":
        kwargs["attn_mask"] = torch.randn(N, M, generator=torch.Generator().manual_seed(2))
    exact = oracle_weights(q, k, r, **kwargs)
    assert (exact[:, :, 0] == 0).all() and (exact[:, :, 1:].sum(-1) > 0).any()
    check_against_oracle(q, k, v, r, grad_out, f"relu zero rows {path}", dtype=dtype, **kwargs)
    ours = fused_and_grads(q, k, v, r, grad_out, dtype=dtype, **kwargs)
    assert (ours[0][:, :, 0] == 0).all() and (ours[1][:, :, 0] == 0).all()
    ref = fourier_attention_reference(q.to(dtype), k.to(dtype), v.to(dtype), r.to(dtype), **kwargs)
    assert (ref[:, :, 0] == 0).all()
    radius = r.to(torch.float64 if dtype == torch.float64 else torch.float32).expand(H, D).contiguous()
    mask = kwargs.get("attn_mask")
    _, lse = torch.ops.fourierformer.fourier_attention_forward(
        q.to(dtype), k.to(dtype), v.to(dtype), radius, 1.0, None if mask is None else mask.reshape(1, 1, N, M),
        None, False, 0.0, 0, 0.0, None, "relu")
    assert torch.isposinf(lse[:, :, 0]).all() and torch.isfinite(lse[:, :, 1:]).any()


@pytest.mark.parametrize("power", [1, 3, 5])
def test_odd_power_declarations_take_it_where_it_runs(power):
    """The CPU and the CUDA backends both run odd p (their power rules take every integer p >= 1):
    neither gives a reason about the power (the CUDA one's reasons here are the inputs' device and,
    without a GPU, its availability)."""
    from fourierformer_fairseq.ops.inputs import prepare_inputs

    q = torch.zeros(1, 1, 2, 4)
    inp = prepare_inputs(q, q, q, torch.tensor(1.0), power=power)
    assert DECLARATIONS["cpu"].not_supported_reasons(inp) == []
    for name in ("cpu", "cuda"):
        declaration = DECLARATIONS[name]
        assert declaration.min_power <= power and power % declaration.power_multiple == 0, name
    reasons = DECLARATIONS["cuda"].not_supported_reasons(inp)
    assert not any("power" in r or "phi" in r for r in reasons), reasons


@pytest.mark.parametrize("power", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_odd_power_rows_near_a_zero_normaliser_against_the_oracle(eps, dtype, power):
    """Rows whose signed weights cancel to a sum of relative size 1e-1 .. 1e-4 (weights up to
    about 1e4): within the oracle's bound, whose terms grow with the row's sum of |P_ij| as the
    cancellation amplifies the kernels' and the plain implementation's rounding alike; the one-pass
    forward (no mask), the log domain (a finite additive mask) and the short-query forward."""
    from math import sin

    x1 = 4.4934094579
    m1 = abs(sin(x1) / x1)
    deltas = (1e-1, 1e-2, 1e-3, 1e-4)

    def solve(target):  # x in (0, pi) with sinc(x)^power = target^power, i.e. sinc(x) = target
        lo, hi = 1e-9, 3.14159
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sin(mid) / mid > target else (lo, mid)
        return (lo + hi) / 2

    H, D, Dv = 2, 4, 5
    g = torch.Generator().manual_seed(power)
    for N, mask in ((len(deltas), None), (len(deltas), "additive"), (2, None)):
        rows = deltas[-N:]
        # one row per sequence (b), its keys in feature 0 at x = q0 (sinc m1 (1 + delta) > 0), x1
        # (sinc -m1) and 2 pi (sinc 0); the other features a little off q's (factors about 1)
        q = torch.zeros(len(rows), H, 1, D, dtype=torch.float64)
        k = torch.zeros(len(rows), H, 3, D, dtype=torch.float64)
        for b, delta in enumerate(rows):
            q[b, :, 0, 0] = solve(m1 * (1 + delta))
            k[b, :, 1, 0] = q[b, 0, 0, 0] - x1  # x = x1: sinc = -m1
            k[b, :, 2, 0] = q[b, 0, 0, 0] - 2 * math.pi  # at sinc's zero (x = 2 pi): a weight of about 0
        q = q + 1e-3 * torch.randn(q.shape, generator=g, dtype=torch.float64) * (torch.arange(D) > 0)
        v = torch.randn(len(rows), H, 3, Dv, generator=g, dtype=torch.float64)
        grad_out = torch.randn(len(rows), H, 1, Dv, generator=g, dtype=torch.float64)
        kwargs = dict(power=power)
        if eps:
            kwargs["normaliser_eps"] = eps
        if mask == "additive":
            kwargs["attn_mask"] = torch.tensor([[0.0, 0.0, -1.0]], dtype=torch.float64)
        exact = oracle_weights(q, k, torch.tensor(1.0, dtype=torch.float64), **kwargs)
        assert exact.abs().sum(-1).max() > 1e3 or eps, "the case has no cancelling row"
        check_against_oracle(q.float(), k.float(), v.float(), torch.tensor(1.0), grad_out.float(),
                             f"p={power} near-zero normaliser N={N} {mask}", dtype=dtype, **kwargs)


@pytest.mark.parametrize("power", [1, 3])
@pytest.mark.parametrize("path", ["one_pass", "additive", "short"])
def test_odd_power_rows_with_no_visible_key_give_zero(path, power):
    """A row that sees no key gives 0 and no gradient (lse +inf) for odd p as for every phi, on
    each forward path, the reference alike."""
    B, H, N, M, D, Dv = 1, 2, 3 if path == "short" else 12, 20, 4, 5
    q, k, v, grad_out = draw(B, H, N, M, D, Dv, 31)
    mask = torch.zeros(N, M) if path == "additive" else torch.zeros(N, M, dtype=torch.bool)
    if path == "additive":
        mask[0] = float("-inf")
        mask[1:, 3] = 0.5
    else:
        mask[0] = True
    r = torch.tensor(2.0)
    ours = fused_and_grads(q, k, v, r, grad_out, power=power, attn_mask=mask)
    assert (ours[0][:, :, 0] == 0).all() and (ours[1][:, :, 0] == 0).all()
    ref = fourier_attention_reference(q, k, v, r, power=power, attn_mask=mask)
    assert (ref[:, :, 0] == 0).all() and torch.isfinite(ref).all()
    check_against_oracle(q, k, v, r, grad_out, f"p={power} no visible key {path}", power=power, attn_mask=mask)
