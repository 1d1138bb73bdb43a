"""The op against its float64 reference, on every backend this machine has.

Tolerance rule (flash-attention's): a backend's error against the float64 reference is at
most 2x the error of the pure-PyTorch reference run in the backend's own precision, plus
a small absolute slack. Tests against the independent oracle (tests/oracle.py) use its
bound: 4x the error of a plain float32 implementation plus 16 float32 eps of the terms'
scale (oracle.oracle_mismatches). Every input is drawn from a seeded generator.
"""
import itertools
import math
import os
import subprocess
import sys

import pytest
import torch

from fuzz_cases import RADIUS_SHAPES
from helpers import NONFINITE, check_against_plain, max_abs_error, nonfinite_case, random_qkv
from oracle import additive_mask as oracle_additive_mask
from oracle import (
    PLAIN_FACTOR,
    lse_mismatches,
    oracle_attention,
    oracle_gradient_scales,
    oracle_gradients,
    oracle_mismatches,
    plain_attention,
)

from fourierformer_fairseq.ops import (
    DECLARATIONS,
    backend_unavailable_reason,
    dropout_keep_mask,
    fourier_attention,
    fourier_attention_reference,
)

CPU_FUSED = not backend_unavailable_reason("cpu")
needs_cpu_kernel = pytest.mark.skipif(not CPU_FUSED, reason=f"fused CPU kernel: {backend_unavailable_reason('cpu')}")



def make_radius(kind, H, D, dtype, value=0.8, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "scalar":
        r = torch.tensor(value, dtype=dtype)
    elif kind == "head":
        r = value + 0.3 * torch.rand(H, 1, generator=g, dtype=dtype)
    elif kind == "feature":
        r = value + 0.3 * torch.rand(D, generator=g, dtype=dtype)
    else:
        r = value + 0.3 * torch.rand(H, D, generator=g, dtype=dtype)
    return r.requires_grad_()


def to64(ts):
    return [t.detach().double().requires_grad_(t.requires_grad) for t in ts]


def run_with_grads(fn, tensors, grad_out_seed=1):
    out = fn(*tensors)
    g = torch.Generator().manual_seed(grad_out_seed)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    grads = torch.autograd.grad(out, tensors, grad_out)
    return out, grads


SIZES = list(itertools.product((1, 7, 97, 256), (1, 7, 97, 256), (1, 16, 59, 128)))


@needs_cpu_kernel
@pytest.mark.parametrize("N,M,D", SIZES, ids=[f"N{n}-M{m}-D{d}" for n, m, d in SIZES])
def test_cpu_forward_float32_matches_float64_reference(N, M, D):
    # radius shape, power, masks and causality rotate with the case so that each appears
    # across many sizes without a full Cartesian product
    case = N * 7 + M * 3 + D
    radius_kind = RADIUS_SHAPES[case % 4]
    # (by the case's place in SIZES: case % 3 is (N + D) % 3 for these sizes, never 1, so p = 4
    # never ran)
    power = (2, 4, 6)[SIZES.index((N, M, D)) % 3]
    # (by (case // 4) % 2, not case % 2: with case % 4 choosing the radius shape, case % 2 ran
    # causal with the scalar and per-feature radii only)
    causal = N <= M and (case // 4) % 2 == 0
    B, H, Dv = 2, 2, 5 if D != 16 else 16
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=case, requires_grad=True)
    r = make_radius(radius_kind, H, D, torch.float32, value=1.0 / math.sqrt(max(D, 1) / 16))
    kpm = torch.zeros(B, M, dtype=torch.bool)
    if M > 1:
        kpm[1, -(M // 3 + 1):] = True
    kwargs = dict(power=power, key_padding_mask=kpm, causal=causal)
    with torch.no_grad():
        ours = fourier_attention(q, k, v, r, backend="cpu", **kwargs)
        same = fourier_attention_reference(q, k, v, r, **kwargs)
        exact = oracle_attention(*to64([q, k, v, r]), **kwargs)
    assert torch.isfinite(ours).all()
    check_against_plain(ours, same, exact, f"out ({radius_kind}, p={power}, causal={causal})", atol=2e-6)


GRAD_SIZES = [(7, 7, 16), (97, 97, 16), (7, 97, 59), (97, 7, 1), (1, 256, 16), (256, 256, 16), (33, 40, 128)]


@needs_cpu_kernel
@pytest.mark.parametrize("N,M,D", GRAD_SIZES)
@pytest.mark.parametrize("radius_kind", RADIUS_SHAPES)
@pytest.mark.parametrize("mask_kind", ["additive", "padding"])
def test_cpu_gradients_float32_match_float64_reference(N, M, D, radius_kind, mask_kind):
    # an additive attn_mask takes the kernels' log-domain path; key padding (0 / -inf) the
    # path whose weights are products and powers of two
    B, H, Dv = 2, 3, 8
    causal = N <= M
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=N + M + D, requires_grad=True)
    r = make_radius(radius_kind, H, D, torch.float32, value=2.0 if D <= 16 else 0.7)
    if mask_kind == "additive":
        mask = torch.zeros(N, M)
        mask[:, 0] = float("-inf") if M > 2 else 0.0
        kwargs = dict(power=4, attn_mask=mask, causal=causal)
    else:
        kpm = torch.zeros(B, M, dtype=torch.bool)
        kpm[1, -(M // 3 + 1):] = M > 2
        kwargs = dict(power=4, key_padding_mask=kpm, causal=causal)
    tensors = [q, k, v, r]
    out, grads = run_with_grads(lambda *t: fourier_attention(*t, backend="cpu", **kwargs), tensors)
    out_s, grads_s = run_with_grads(lambda *t: fourier_attention_reference(*t, **kwargs), tensors)
    out_x, grads_x = run_with_grads(lambda *t: fourier_attention_reference(*t, **kwargs), to64(tensors))
    check_against_plain(out, out_s, out_x, "out", atol=2e-6)
    for name, g, gs, gx in zip("qkv", grads, grads_s, grads_x):
        assert g.shape == gx.shape and g.dtype == torch.float32
        scale = max(1.0, gx.abs().max().item())
        check_against_plain(g, gs, gx, f"grad {name}", atol=2e-5 * scale)
    # the scalar radius's gradient is one sum over all B H N M D terms of both signs (0.35 out of
    # terms of order 1 at 7 x 97 x 59): its float32 error depends on the summation order, which
    # differs between the kernel variants and the plain implementation (measured 2026-11-27: the
    # avx2 variant 2.0e-4, avx512 8.7e-5, generic 7.6e-5, plain 8.2e-5), so it gets the oracle's
    # factor for reductions (PLAIN_FACTOR, as in the fuzz) rather than 2
    g, gs, gx = grads[3], grads_s[3], grads_x[3]
    check_against_plain(g, gs, gx, "grad radius", atol=2e-5 * max(1.0, gx.abs().max().item()), factor=PLAIN_FACTOR)


@needs_cpu_kernel
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("radius_kind", RADIUS_SHAPES)
def test_cpu_float64_equals_reference_and_passes_gradcheck(causal, radius_kind):
    B, H, N, M, D, Dv = 2, 2, 5, 7, 3, 4
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float64, seed=3, requires_grad=True)
    r = make_radius(radius_kind, H, D, torch.float64)
    kpm = torch.zeros(B, M, dtype=torch.bool)
    kpm[0, 0] = True
    kwargs = dict(power=2, key_padding_mask=kpm, causal=causal)
    ours = fourier_attention(q, k, v, r, backend="cpu", **kwargs)
    ref = fourier_attention_reference(q, k, v, r, **kwargs)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: fourier_attention(*t, backend="cpu", **kwargs), (q, k, v, r))


def test_reference_passes_gradcheck_for_every_phi():
    B, H, N, M, D = 1, 2, 3, 4, 2
    q, k, v = random_qkv(B, H, N, M, D, 3, dtype=torch.float64, seed=5, requires_grad=True)
    r = make_radius("head", H, D, torch.float64)
    for phi, power in (("power", 4), ("power", 3), ("abs", 1), ("relu", 1), ("sigmoid", 1)):
        fn = lambda *t: fourier_attention_reference(*t, phi=phi, power=power)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k, v, r)), (phi, power)


def fused_and_grads(q, k, v, r, grad_out, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, r)]
    out = fourier_attention(*leaves, backend="cpu", **kwargs)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad_out))


def assert_matches_oracle(q, k, v, r, grad_out, what="", **kwargs):
    ours = fused_and_grads(q, k, v, r, grad_out, **kwargs)
    bad = oracle_mismatches(ours, q, k, v, r, grad_out, **kwargs)
    assert not bad, f"{what} p={kwargs.get('power')}: " + "; ".join(bad)


MASK_KINDS = ("none", "causal", "padded", "causal_padded", "additive")


def mask_kwargs(mask_kind, B, N, M, seed=0):
    g = torch.Generator().manual_seed(seed)
    kwargs = {}
    if mask_kind.startswith("causal"):
        kwargs["causal"] = True
    if mask_kind.endswith("padded"):
        kpm = torch.zeros(B, M, dtype=torch.bool)
        kpm[-1, -(M // 3 + 1):] = True  # the last sequence right-padded
        kpm[0, :2] = True  # the first left-padded
        kwargs["key_padding_mask"] = kpm
    if mask_kind == "additive":  # finite, non-zero values (the kernels' log-domain path) and some -inf
        mask = torch.randn(N, M, generator=g) * 2
        mask[:, 1] = float("-inf")
        kwargs["attn_mask"] = mask
    return kwargs


@needs_cpu_kernel
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("radius_kind", RADIUS_SHAPES)
@pytest.mark.parametrize("power", [2, 4, 6])
def test_cpu_every_power_radius_shape_and_mask(power, radius_kind, mask_kind):
    # every combination explicitly (p = 4 with each radius shape, causal and padded; causal with
    # per-head and per-(head, feature) radii), forward and the four gradients, against the
    # oracle. N = 19 and M = 37 leave a remainder in every row group and lane width; Dv = 37
    # leaves a tail after two 16-column chunks.
    B, H, N, M, D, Dv = 2, 2, 19, 37, 16, 37
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=power * 10 + len(radius_kind))
    r = make_radius(radius_kind, H, D, torch.float32, value=1.5).detach()
    grad_out = torch.randn(B, H, N, Dv, generator=torch.Generator().manual_seed(3))
    assert_matches_oracle(q, k, v, r, grad_out, f"{radius_kind} {mask_kind}", power=power,
                          **mask_kwargs(mask_kind, B, N, M))


@needs_cpu_kernel
@pytest.mark.parametrize("mask_kind", ["causal_padded", "additive"])
@pytest.mark.parametrize("radius_kind", ["scalar", "head_feature"])
@pytest.mark.parametrize("power", [8, 10, 16])
def test_cpu_powers_of_8_and_more(power, radius_kind, mask_kind):
    # the kernels take every even p (sinc^p by repeated squaring, p log|sinc| in the log domain):
    # p >= 8, forward and the four gradients against the oracle
    B, H, N, M, D, Dv = 2, 2, 19, 37, 16, 5
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=power + len(radius_kind))
    r = make_radius(radius_kind, H, D, torch.float32, value=1.0).detach()
    grad_out = torch.randn(B, H, N, Dv, generator=torch.Generator().manual_seed(power))
    assert_matches_oracle(q, k, v, r, grad_out, f"{radius_kind} {mask_kind}", power=power,
                          **mask_kwargs(mask_kind, B, N, M))


@needs_cpu_kernel
@pytest.mark.parametrize("form", ["BH_N_M", "B_H_N_M", "B_1_N_M", "1_H_N_M"])
def test_cpu_finite_additive_masks_per_batch_and_head(form):
    # additive masks with finite values (and some -inf) that differ per (batch, head), in every
    # accepted form: (B*H, N, M), (B, H, N, M), (B, 1, N, M) and (1, H, N, M), with padding and
    # causality on top; forward and gradients against the oracle, which reads the same mask
    B, H, N, M, D, Dv = 2, 3, 9, 21, 16, 4
    g = torch.Generator().manual_seed(len(form))
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=len(form))
    r = make_radius("head", H, D, torch.float32, value=1.5).detach()
    shape = {"BH_N_M": (B * H, N, M), "B_H_N_M": (B, H, N, M), "B_1_N_M": (B, 1, N, M), "1_H_N_M": (1, H, N, M)}[form]
    mask = torch.randn(shape, generator=g) * 3
    mask[torch.rand(shape, generator=g) < 0.15] = float("-inf")
    kpm = torch.zeros(B, M, dtype=torch.bool)
    kpm[1, -4:] = True
    grad_out = torch.randn(B, H, N, Dv, generator=g)
    assert_matches_oracle(q, k, v, r, grad_out, form, power=4, attn_mask=mask, key_padding_mask=kpm, causal=True)
    # a mask that is the same for every (batch, head) would not see a kernel that reads one slice
    # for all: the slices here differ
    flat = mask.reshape(-1, N, M)
    assert not torch.equal(flat[0], flat[-1])


@needs_cpu_kernel
@pytest.mark.parametrize("power", [2, 4])
@pytest.mark.parametrize("D", [64, 128])
def test_cpu_head_dims_64_and_128(power, D):
    B, H, N, M, Dv = 1, 2, 9, 33, 16
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=D + power)
    q = q * 0.5
    k = torch.cat([k[:, :, :-2] * 0.5, q[:, :, :2]], 2)  # two keys duplicate queries
    r = torch.tensor(1.0 / math.sqrt(D / 16))
    grad_out = torch.randn(B, H, N, Dv, generator=torch.Generator().manual_seed(4))
    assert_matches_oracle(q, k, v, r, grad_out, f"D={D}", power=power, causal=True)


@needs_cpu_kernel
@pytest.mark.parametrize("radius", [10.0, 100.0])
def test_cpu_large_angles_range_reduction(radius):
    # |R q| up to ~4e8: beyond the kernels' Cody-Waite reduction (2^28) for R = 100, far into
    # it for R = 10. q and k are near 2^22 on a grid of 0.5, so q - k is exact in float32 and
    # a plain float32 implementation keeps x = R (q - k) to an ulp.
    g = torch.Generator().manual_seed(int(radius))
    B, H, N, M, D, Dv = 1, 1, 5, 11, 8, 3
    base = 2.0**22
    q = base + 0.5 * torch.randint(-8, 9, (B, H, N, D), generator=g).float()
    k = base + 0.5 * torch.randint(-8, 9, (B, H, M, D), generator=g).float()
    k[0, 0, 3] = q[0, 0, 1]  # one duplicate
    v = torch.randn(B, H, M, Dv, generator=g)
    grad_out = torch.randn(B, H, N, Dv, generator=g)
    r = torch.tensor(radius)
    assert (r * q).abs().max() > (2**28 if radius == 100.0 else 2**25)
    assert_matches_oracle(q, k, v, r, grad_out, f"R={radius}", power=2)


@needs_cpu_kernel
@pytest.mark.parametrize("phi", ["abs", "power"])
def test_cpu_large_angles_short_query_reduction(phi):
    """The short-query forward (N = 3, below every variant's row group) at |x| up to 2^14, where
    it reduces x = R (k - q) by pi in float32 (forward_short.inc's reduce_by_pi). q and k lie on
    a grid of 2^-6 below 2^12 and R = 2, so q - k and x are exact in float32 and a plain float32
    implementation errs only by its sin and log: the bounds (lse_mismatches for each row's
    log-sum, oracle_mismatches for out and the gradients) leave no room for an error of
    ulp(n pi) / 2 in r = x - n pi (up to 1e-3 here), which the baseline variant made when, without
    FMA, it rounded n pi to float32 before subtracting (the full tier's generic fuzz, seed 139)."""
    g = torch.Generator().manual_seed(139)
    B, H, N, M, D, Dv = 2, 2, 3, 40, 4, 5
    q = torch.randint(-2**18, 2**18, (B, H, N, D), generator=g).float() * 2.0**-6
    k = torch.randint(-2**18, 2**18, (B, H, M, D), generator=g).float() * 2.0**-6
    v = torch.randn(B, H, M, Dv, generator=g)
    grad_out = torch.randn(B, H, N, Dv, generator=g)
    r = torch.tensor(2.0)
    assert 4096 < (r * (q.unsqueeze(3) - k.unsqueeze(2))).abs().max() <= 32768  # (the float32 reduction's range)
    kw = dict(power=2) if phi == "power" else dict(power=2, phi=phi)
    _, lse = torch.ops.fourierformer.fourier_attention_forward(q, k, v, r.expand(H, D).contiguous(),
                                                               2.0 if phi == "power" else 1.0, None, None, False, 0.0, 0,
                                                               0.0, None, phi)
    bad = lse_mismatches(lse, q, k, r, **kw)
    assert not bad, f"phi={phi}: " + "; ".join(bad)
    assert_matches_oracle(q, k, v, r, grad_out, f"phi={phi}", **kw)


@needs_cpu_kernel
@pytest.mark.parametrize("shape", [(0, 2, 3, 4), (2, 2, 0, 4), (2, 2, 3, 0)], ids=["B0", "N0", "M0"])
def test_cpu_empty_batch_queries_or_keys(shape):
    B, H, N, M = shape
    D, Dv = 5, 3
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, N, D, generator=g).requires_grad_()
    k = torch.randn(B, H, M, D, generator=g).requires_grad_()
    v = torch.randn(B, H, M, Dv, generator=g).requires_grad_()
    r = torch.tensor(1.0, requires_grad=True)
    out = fourier_attention(q, k, v, r, backend="cpu")
    assert out.shape == (B, H, N, Dv) and (out == 0).all()  # no keys: every row fully masked
    out.sum().backward()
    for t in (q, k, v, r):
        assert t.grad is not None and t.grad.shape == t.shape and (t.grad == 0).all()


@needs_cpu_kernel
def test_cpu_workspace_above_the_kept_size():
    # a slice's tables above 16 MiB (4M floats: 4 key fields x D x M = 4.2M here) take the
    # per-call workspace instead of the thread's kept one
    B, H, N, M, D, Dv = 1, 1, 6, 4100, 256, 5
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, N, D, generator=g) * 0.3
    k = torch.randn(B, H, M, D, generator=g) * 0.3
    k[0, 0, 77] = q[0, 0, 2]
    v = torch.randn(B, H, M, Dv, generator=g)
    grad_out = torch.randn(B, H, N, Dv, generator=g)
    assert 4 * D * M > (1 << 22)
    assert_matches_oracle(q, k, v, torch.tensor(1.0), grad_out, "workspace", power=4)


@needs_cpu_kernel
def test_cpu_non_contiguous_inputs_equal_contiguous():
    B, H, N, M, D, Dv = 2, 3, 7, 9, 16, 5
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, N, H, D, generator=g).transpose(1, 2)  # fairseq-like (B, N, H, D) views
    k = torch.randn(B, M, H, D, generator=g).transpose(1, 2)
    v = torch.randn(B, H, Dv, M, generator=g).transpose(2, 3)
    r = torch.tensor(1.3)
    grad_out = torch.randn(B, H, N, Dv, generator=g)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    strided = fused_and_grads(q, k, v, r, grad_out, power=4, causal=True)
    dense = fused_and_grads(q.contiguous(), k.contiguous(), v.contiguous(), r, grad_out, power=4, causal=True)
    for a, b in zip(strided, dense):
        assert torch.equal(a, b)


@needs_cpu_kernel
def test_cpu_results_do_not_depend_on_the_thread_count():
    B, H, N, M, D, Dv = 3, 4, 17, 29, 16, 8
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=12)
    r = make_radius("head_feature", H, D, torch.float32).detach()
    grad_out = torch.randn(B, H, N, Dv, generator=torch.Generator().manual_seed(6))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(fused_and_grads(q, k, v, r, grad_out, power=4, causal=True))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@needs_cpu_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_half_inputs_are_refused_clearly_and_auto_runs_the_reference(dtype):
    B, H, N, M, D, Dv = 1, 2, 5, 7, 8, 3
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=8, to=dtype)
    r = torch.tensor(1.0, dtype=dtype)
    with pytest.raises(ValueError, match="the cpu kernel takes torch.float32, torch.float64"):
        fourier_attention(q, k, v, r, backend="cpu")
    with pytest.raises(RuntimeError, match="float32 and float64 are supported"):
        torch.ops.fourierformer.fourier_attention_forward(q, k, v, r.expand(H, D).float(), 4.0, None, None, False, 0.0, 0)
    out = fourier_attention(q, k, v, r)  # auto: the reference, in the inputs' dtype
    assert out.dtype == dtype
    exact = oracle_attention(q.double(), k.double(), v.double(), r.double())
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(out.double(), exact, rtol=tol, atol=tol)


@needs_cpu_kernel
@pytest.mark.parametrize("causal,dropout_p", [(False, 0.0), (True, 0.0), (False, 0.25)])
def test_bool_masks_equal_float_inf_masks(causal, dropout_p):
    """A bool attn_mask / key_padding_mask (passed to the kernels as bool) and the same masks as
    additive float 0 / -inf give the same outputs and gradients, on the fused CPU kernel and the
    reference, and agree across the two."""
    B, H, N, M, D, Dv = 2, 3, 9, 11, 8, 5
    g = torch.Generator().manual_seed(21)
    blocked = torch.rand(B, H, N, M, generator=g) < 0.3
    padding = torch.rand(B, M, generator=g) < 0.2
    additive = torch.zeros(B, H, N, M).masked_fill(blocked, float("-inf"))
    results = {}
    for backend in ("cpu", "reference"):
        for kind, mask in (("bool", blocked), ("float", additive)):
            q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=22, requires_grad=True)
            r = make_radius("head", H, D, torch.float32)
            torch.manual_seed(5)  # the dropout mask
            out = fourier_attention(q, k, v, r, attn_mask=mask, key_padding_mask=padding, causal=causal,
                                    dropout_p=dropout_p, backend=backend)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(23)))
            results[backend, kind] = [t.detach() for t in (out, q.grad, k.grad, v.grad, r.grad)]
    # (the fused kernel takes different float32 paths for the two: no logs for bool masks)
    for backend in ("cpu", "reference"):
        for a, b in zip(results[backend, "bool"], results[backend, "float"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(results["cpu", "bool"], results["reference", "bool"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_cpu_kernel
def test_the_op_takes_float_and_bool_key_bias():
    """The op's key_bias: an additive float (B, M) mask as before (finite values too), or bool."""
    B, H, N, M, D, Dv = 2, 2, 5, 7, 4, 3
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=24)
    radius = torch.full((H, D), 0.9)
    padding = torch.zeros(B, M, dtype=torch.bool)
    padding[0, 5:] = True
    op = torch.ops.fourierformer.fourier_attention_forward
    as_bool, _ = op(q, k, v, radius, 4.0, None, padding, False, 0.0, 0)
    as_float, _ = op(q, k, v, radius, 4.0, None, torch.zeros(B, M).masked_fill(padding, float("-inf")), False, 0.0, 0)
    torch.testing.assert_close(as_bool, as_float, rtol=1e-5, atol=1e-6)
    bias = torch.randn(B, M, generator=torch.Generator().manual_seed(25))
    finite, _ = op(q, k, v, radius, 4.0, None, bias, False, 0.0, 0)
    expected = fourier_attention_reference(q, k, v, radius, power=4, attn_mask=bias.reshape(B, 1, 1, M).expand(B, 1, N, M))
    torch.testing.assert_close(finite, expected, rtol=1e-4, atol=1e-5)


def backends_here():
    return ["reference"] + (["cpu"] if CPU_FUSED else [])


@pytest.mark.parametrize("backend", backends_here())
def test_all_keys_equal_gives_mean_of_values(backend):
    B, H, N, M, D = 1, 2, 4, 9, 16
    g = torch.Generator().manual_seed(11)
    q = torch.randn(B, H, N, D, generator=g)
    k = torch.randn(B, H, 1, D, generator=g).expand(B, H, M, D).contiguous()
    v = torch.randn(B, H, M, 5, generator=g)
    out = fourier_attention(q, k, v, torch.tensor(1.5), backend=backend)
    torch.testing.assert_close(out, v.mean(2, keepdim=True).expand_as(out), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", backends_here())
@pytest.mark.parametrize("seed", range(8))
def test_query_equal_to_a_key_at_large_radius_returns_that_value(backend, seed):
    # (N = 1 leaves padding rows in every kernel's row group)
    B, H, M, D = 1, 1, 12, 16
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, M, D, generator=g)
    v = torch.randn(B, H, M, 3, generator=g)
    q = k[:, :, 5:6].clone()
    for radius in (10.0, 40.0):
        out = fourier_attention(q, k, v, torch.tensor(radius), backend=backend)
        torch.testing.assert_close(out[0, 0, 0], v[0, 0, 5], rtol=1e-5, atol=1e-5)


@needs_cpu_kernel
@pytest.mark.parametrize("padding", ["none", "left"])
@pytest.mark.parametrize("shift", [0.0, 30.0])
def test_cpu_weights_against_the_first_visible_block_match_the_reference(padding, shift):
    # The CPU kernel weighs keys against the largest score of each row's first visible block
    # of keys, and redoes a group of rows in two passes when a later block scores far higher:
    # with shift 30 each query sits near one late key (score near 0) while the first blocks'
    # keys are far away (scores below -200). Left padding (fairseq's default for sources)
    # makes the first blocks invisible to the second batch element.
    B, H, N, M, D = 2, 2, 5, 70, 16
    g = torch.Generator().manual_seed(7)
    k = torch.randn(B, H, M, D, generator=g)
    k[:, :, :32] += shift
    v = torch.randn(B, H, M, 4, generator=g)
    q = k[:, :, 40:40 + N].clone() + 0.05 * torch.randn(B, H, N, D, generator=g)
    kpm = torch.zeros(B, M, dtype=torch.bool)
    if padding == "left":
        kpm[1, :20] = True
    r = torch.tensor(2.0)
    with torch.no_grad():
        ours = fourier_attention(q, k, v, r, key_padding_mask=kpm, backend="cpu")
        same = fourier_attention_reference(q, k, v, r, key_padding_mask=kpm)
        exact = oracle_attention(*to64([q, k, v, r]), key_padding_mask=kpm)
    assert torch.isfinite(ours).all()
    check_against_plain(ours, same, exact, "out", atol=2e-6)


@pytest.mark.parametrize("backend", backends_here())
def test_sinc_zeros_and_q_equal_k_are_finite(backend):
    # x = R (q - k) lands exactly on 0 and near the zeros n * pi of sinc
    D = 4
    k = torch.zeros(1, 1, 5, D)
    q = torch.zeros(1, 1, 3, D)
    k[0, 0, 1, :] = math.pi
    k[0, 0, 2, 0] = 2 * math.pi
    k[0, 0, 3, :2] = -math.pi
    v = torch.randn(1, 1, 5, 2, generator=torch.Generator().manual_seed(5))
    tensors = [t.clone().requires_grad_() for t in (q, k, v)] + [torch.tensor(1.0, requires_grad=True)]
    out = fourier_attention(*tensors, power=2, backend=backend)
    out.sum().backward()
    assert torch.isfinite(out).all()
    for t in tensors:
        assert torch.isfinite(t.grad).all()
    # the keys at sinc zeros get (numerically) no weight; q = k keys share the rest
    expected = (v[0, 0, 0] + v[0, 0, 4]) / 2
    torch.testing.assert_close(out[0, 0, 0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", backends_here())
def test_a_key_just_off_a_sinc_zero_keeps_its_tiny_weight(backend):
    # Key 1 matches the query in 15 features, but its 16th is 3e-6 past sinc's zero at pi:
    # sinc^4 there is about 1e-24, so key 1 weighs ~1e-24 while key 0 (every feature at
    # x = 2) weighs ~1e-22 and must win. A kernel that raised |sin x| to a floor near the
    # zero (2^-12 gives ~4e-17) would hand the output to key 1.
    D = 16
    q = torch.zeros(1, 1, 1, D)
    k = torch.zeros(1, 1, 2, D)
    k[0, 0, 0, :] = 2.0
    k[0, 0, 1, 0] = math.pi + 3e-6
    v = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    r = torch.tensor(1.0)
    with torch.no_grad():
        ours = fourier_attention(q, k, v, r, power=4, backend=backend)
        same = plain_attention(q, k, v, r, power=4)  # (not the reference: one backend here is the reference)
        exact = oracle_attention(*to64([q, k, v, r]), power=4)
    assert exact[0, 0, 0, 0] > 0.99
    check_against_plain(ours, same, exact, "out", atol=1e-6)


@pytest.mark.parametrize("backend", backends_here())
@pytest.mark.parametrize("causal", [False, True])
def test_keys_at_the_floor_in_some_rows_match_the_reference(backend, causal):
    # The fast CPU step multiplies s and q - k in without floors and recomputes only the rows
    # whose block of keys has q - k at or below the floor in some feature: here a few (row,
    # key) pairs are exactly equal in one feature, or closer than the floor, in some rows of
    # a group only, and one row has a key equal in every feature.
    g = torch.Generator().manual_seed(3)
    B, H, N, M, D = 1, 2, 21, 40, 16
    q = torch.randn(B, H, N, D, generator=g)
    k = torch.randn(B, H, M, D, generator=g)
    v = torch.randn(B, H, M, 3, generator=g)
    for h, i, j, d in [(0, 0, 5, 3), (0, 9, 18, 0), (1, 20, 39, 15), (1, 3, 3, 7)]:
        k[0, h, j, d] = q[0, h, i, d]  # u = 0 exactly
    for h, i, j, d, gap in [(0, 2, 30, 8, 1e-6), (1, 12, 33, 1, 3e-6), (1, 13, 6, 11, -2e-6)]:
        k[0, h, j, d] = q[0, h, i, d] + gap  # below the floor, not 0
    k[0, 1, 17] = q[0, 1, 17]  # a key equal to its query in every feature
    r = torch.tensor(2.0)
    with torch.no_grad():
        ours = fourier_attention(q, k, v, r, power=4, causal=causal, backend=backend)
        same = plain_attention(q, k, v, r, power=4, causal=causal)  # (not the reference, as above)
        exact = oracle_attention(*to64([q, k, v, r]), power=4, causal=causal)
    assert torch.isfinite(ours).all()
    check_against_plain(ours, same, exact, "out", atol=2e-6)


def published_fourier_attention(q, k, v, r, p):
    """The published code's approach: product of sincs in the linear domain, + 1e-6."""
    x = r * (q.unsqueeze(-2) - k.unsqueeze(-3))
    w = (torch.sin(x) / x).pow(p).prod(-1)
    return (w @ v) / (w.sum(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("backend", backends_here())
def test_no_underflow_at_head_dim_128(backend):
    B, H, N, D = 1, 2, 16, 128
    q, k, v = random_qkv(B, H, N, N, D, 8, dtype=torch.float32, seed=9)
    r = torch.tensor(1.0)
    published = published_fourier_attention(q, k, v, r, 4)
    assert published.abs().max() < 1e-3, "the linear-domain product should underflow here"
    ours = fourier_attention(q, k, v, r, power=4, backend=backend)
    exact = oracle_attention(q.double(), k.double(), v.double(), r.double(), power=4)
    assert ours.abs().max() > 0.1
    torch.testing.assert_close(ours.double(), exact, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", backends_here())
def test_fully_masked_rows_give_zero_output_and_gradient(backend):
    B, H, N, M, D = 2, 2, 4, 6, 8
    q, k, v = random_qkv(B, H, N, M, D, 3, dtype=torch.float32, requires_grad=True)
    r = torch.tensor(1.0, requires_grad=True)
    mask = torch.zeros(N, M)
    mask[1] = float("-inf")
    kpm = torch.zeros(B, M, dtype=torch.bool)
    kpm[1] = True  # the whole second sequence is padding
    out = fourier_attention(q, k, v, r, attn_mask=mask, key_padding_mask=kpm, backend=backend)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert (out[:, :, 1] == 0).all() and (out[1] == 0).all()
    assert (q.grad[:, :, 1] == 0).all() and (q.grad[1] == 0).all()
    assert (k.grad[1] == 0).all() and (v.grad[1] == 0).all()
    assert out[0, :, 0].abs().sum() > 0


@pytest.mark.parametrize("backend", backends_here())
def test_mask_forms_agree(backend):
    B, H, N, M, D = 2, 3, 5, 7, 4
    q, k, v = random_qkv(B, H, N, M, D, 3, dtype=torch.float32)
    r = torch.tensor(1.2)
    causal = torch.full((N, M), float("-inf")).triu(M - N + 1)
    outs = [
        fourier_attention(q, k, v, r, causal=True, backend=backend),
        fourier_attention(q, k, v, r, attn_mask=causal, backend=backend),
        fourier_attention(q, k, v, r, attn_mask=causal.expand(B * H, N, M), backend=backend),
        fourier_attention(q, k, v, r, attn_mask=causal.isinf(), backend=backend),
        fourier_attention(q, k, v, r, attn_mask=causal.reshape(1, 1, N, M).expand(B, 1, N, M), backend=backend),
    ]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0])
    # padding keys get zero weight: removing them changes nothing
    kpm = torch.zeros(B, M, dtype=torch.bool)
    kpm[:, 4:] = True
    padded = fourier_attention(q, k, v, r, key_padding_mask=kpm, backend=backend)
    trimmed = fourier_attention(q, k[:, :, :4], v[:, :, :4], r, backend=backend)
    torch.testing.assert_close(padded, trimmed)


@pytest.mark.parametrize("backend", backends_here())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_dropout_mask_weights_and_gradients_against_the_oracle(dtype, causal, backend):
    # The mask is the counter-based hash (ops.dropout_keep_mask, mirrored in C++) of the seed the
    # op draws; kept weights are the oracle's over (1 - p), the dropped fraction is within 5
    # standard deviations of p, the output is the returned weights times v, and the gradients
    # are those of the float64 oracle with that mask. Bounds: 4x the error of the plain float32
    # formula with the same mask (oracle.plain_weights) plus 16 float32 eps of the scale: the
    # oracle's sums of absolute terms without dropout (oracle_gradient_scales), over (1 - p) (a
    # kept weight's factor; 1 for the weights themselves). float64: within 1e-9 of that scale
    # (as the fuzz's float64 check).
    from oracle import EPS32, oracle_weights, plain_weights

    from fourierformer_fairseq.ops.reference import draw_seed

    B, H, N, M, D, p = 2, 2, 6, 40, 8, 0.3
    q, k, v = random_qkv(B, H, N, M, D, 4, dtype=dtype, requires_grad=True)
    r = torch.tensor(0.5, dtype=dtype, requires_grad=True)
    torch.manual_seed(123)
    out, weights = fourier_attention(q, k, v, r, dropout_p=p, need_weights=True, causal=causal, backend=backend)
    torch.manual_seed(123)
    keep = dropout_keep_mask(draw_seed(), (B, H, N, M), p, "cpu")
    visible = torch.ones(N, M, dtype=torch.bool).tril(M - N) if causal else torch.ones(N, M, dtype=torch.bool)
    assert torch.equal(weights != 0, keep & visible)  # (every visible weight is positive here)
    n = keep.numel()
    assert abs(1 - keep.double().mean().item() - p) < 5 * (p * (1 - p) / n) ** 0.5

    def dropped(weight_fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, r)]
        P = weight_fn(leaves[0], leaves[1], leaves[3], power=4, causal=causal) * keep.to(dtype) / (1 - p)
        o = P @ leaves[2]
        return [P.detach(), o.detach(), *torch.autograd.grad(o.sum(), leaves)]

    exact = dropped(oracle_weights, torch.float64)
    plain = dropped(plain_weights, torch.float32)
    ours = [weights.detach(), out.detach(), *torch.autograd.grad(out.sum(), (q, k, v, r))]
    scales = [1.0] + [s / (1 - p) for s in oracle_gradient_scales(q, k, v, r, torch.ones(B, H, N, 4), power=4,
                                                                  causal=causal)]
    for name, a, x, pl, scale in zip(("weights", "out", "dq", "dk", "dv", "dradius"), ours, exact, plain, scales):
        err, perr = max_abs_error(a, x), max_abs_error(pl, x)
        bound = 4 * perr + 16 * EPS32 * scale if dtype == torch.float32 else 1e-9 * scale
        assert err <= bound, f"{backend} {dtype} causal={causal} {name}: error {err:.3e} > {bound:.3e} (plain {perr:.3e})"
    torch.testing.assert_close(out.detach().double(), weights.double() @ v.detach().double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", backends_here())
@pytest.mark.parametrize("mask_kind", ["additive", "bool", "causal", "padding", "causal_padding"])
def test_need_weights_against_the_oracle(backend, mask_kind):
    # The weights a backend returns with need_weights (the fused kernels compute them: their
    # forward again with the identity as values) against the float64 oracle, within 4x the
    # plain float32 formula's error plus 16 float32 eps (weights are at most 1); rows with no
    # visible key are 0; the output is the weights times v. M = 37: a key-lane remainder.
    from oracle import EPS32, oracle_weights, plain_weights

    B, H, N, M, D, Dv = 2, 2, 7, 37, 16, 5
    g = torch.Generator().manual_seed(41)
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=41)
    r = make_radius("head", H, D, torch.float32, value=1.5).detach()
    kwargs = {}
    if mask_kind == "additive":
        mask = torch.randn(N, M, generator=g) * 2
        mask[:, 3] = float("-inf")
        mask[2] = float("-inf")  # a row with no visible key
        kwargs["attn_mask"] = mask
    if mask_kind == "bool":
        mask = torch.rand(B * H, N, M, generator=g) < 0.3
        mask[:, 4] = True
        kwargs["attn_mask"] = mask
    if mask_kind.startswith("causal"):
        kwargs["causal"] = True
    if mask_kind.endswith("padding"):
        kpm = torch.zeros(B, M, dtype=torch.bool)
        kpm[0, -5:] = True
        kpm[1] = True  # a fully padded sequence
        kwargs["key_padding_mask"] = kpm
    out, weights = fourier_attention(q, k, v, r, need_weights=True, backend=backend, **kwargs)
    exact = oracle_weights(q, k, r, power=4, **kwargs)
    plain = plain_weights(q, k, r, power=4, **kwargs)
    assert weights.shape == (B, H, N, M) and weights.dtype == torch.float32
    err, perr = max_abs_error(weights, exact), max_abs_error(plain, exact)
    assert err <= 4 * perr + 16 * EPS32, f"{backend} {mask_kind}: error {err:.3e} > 4 x plain {perr:.3e} + 16 eps"
    assert (weights[exact.sum(-1) == 0] == 0).all()
    # the output is these weights times v, to the rounding of a float32 sum of M terms
    err = max_abs_error(out, weights.double() @ v.double())
    assert err <= M * EPS32 * v.abs().max().item(), f"{backend} {mask_kind}: out - weights v: {err:.3e}"


@needs_cpu_kernel
@pytest.mark.parametrize("columns", [None, 1, 5, 16], ids=lambda c: f"columns{c}")
@pytest.mark.parametrize("kind", ["causal_padding", "dropout_null_key"])
def test_need_weights_in_column_chunks_and_their_gradients(kind, columns, monkeypatch):
    # fused_weights runs the kernel on chunks of key columns (on CUDA the kernel's value-width
    # limit; here ops.fused.WEIGHTS_COLUMNS): M = 37 in one chunk, or in chunks of 1, 5 (a
    # remainder chunk of 2) or 16 columns. The weights and the gradients of sum(weights * G)
    # w.r.t. q, k and the radius (through each chunk's backward), G random, against the float64
    # oracle with v the identity (out = P I = P): oracle_mismatches' bound (4 x the plain float32
    # formula's error + (16, with the null key 16 + p D) eps32 x the terms' scale).
    from oracle import oracle_mismatches

    from fourierformer_fairseq.ops import fused
    from fourierformer_fairseq.ops.reference import draw_seed

    monkeypatch.setattr(fused, "WEIGHTS_COLUMNS", columns)
    B, H, N, M, D = 2, 2, 7, 37, 16
    q, k, _ = random_qkv(B, H, N, M, D, 1, dtype=torch.float32, seed=43)
    r = make_radius("head_feature", H, D, torch.float32, value=1.5, seed=43).detach()
    G = torch.randn(B, H, N, M, generator=torch.Generator().manual_seed(44))
    kwargs = dict(power=4)
    if kind == "causal_padding":
        kpm = torch.zeros(B, M, dtype=torch.bool)
        kpm[0, -5:] = True
        kpm[1, :3] = True
        kwargs.update(causal=True, key_padding_mask=kpm)
    oracle_kwargs = dict(kwargs)
    if kind == "dropout_null_key":
        p = 0.3
        kwargs.update(dropout_p=p, normaliser_eps=1e-3)
        oracle_kwargs["normaliser_eps"] = 1e-3
        with torch.random.fork_rng():
            torch.manual_seed(5)
            oracle_kwargs["dropout_scale"] = dropout_keep_mask(draw_seed(), (B, H, N, M), p, "cpu").double() / (1 - p)
    leaves = [t.clone().requires_grad_() for t in (q, k, r)]
    with torch.random.fork_rng():
        torch.manual_seed(5)
        _, weights = fourier_attention(leaves[0], leaves[1], torch.zeros(B, H, M, 1), leaves[2], need_weights=True,
                                       backend="cpu", **kwargs)
    dq, dk, dr = torch.autograd.grad(weights, leaves, G)
    eye = torch.eye(M).expand(B, H, M, M)
    bad = oracle_mismatches((weights.detach(), dq, dk, None, dr), q, k, eye, r, G, **oracle_kwargs)
    assert not bad, f"{kind}, columns {columns}:\n" + "\n".join(bad)


@pytest.mark.parametrize("op", ["fourier_reference", "fourier_cpu", "gaussian"])
def test_need_weights_are_the_weights_after_dropout_in_every_op(op):
    # One contract for the weights need_weights returns (fourier_attention's docstring): after
    # dropout, as applied to v, so out = weights v; zero where the mask drops, the weights
    # without dropout over (1 - p) where it keeps. The Gaussian ablation keeps it too.
    from fourierformer_fairseq.ops.gaussian import gaussian_attention
    from fourierformer_fairseq.ops.reference import draw_seed

    if op == "fourier_cpu" and not CPU_FUSED:
        pytest.skip(f"fused CPU kernel: {backend_unavailable_reason('cpu')}")
    B, H, N, M, D, Dv, p = 2, 2, 6, 11, 8, 3, 0.4
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=8)
    r = torch.tensor(0.7)
    if op == "gaussian":
        def fn(**kw):
            return gaussian_attention(q, k, v, r, power=4, causal=True, **kw)
    else:
        def fn(**kw):
            return fourier_attention(q, k, v, r, power=4, causal=True,
                                     backend="reference" if op == "fourier_reference" else "cpu", **kw)
    torch.manual_seed(21)
    out, weights = fn(dropout_p=p, need_weights=True)
    torch.manual_seed(21)
    keep = dropout_keep_mask(draw_seed(), (B, H, N, M), p, "cpu")
    _, undropped = fn(need_weights=True)
    visible = torch.ones(N, M, dtype=torch.bool).tril(M - N)
    assert (~keep & visible).any() and (keep & visible).any()
    assert (weights[~keep] == 0).all()
    torch.testing.assert_close(weights, undropped * keep / (1 - p), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, weights @ v, rtol=1e-5, atol=1e-5)


def test_odd_power_and_other_phis_against_their_formula_and_the_backends_that_run_them():
    q, k, v = random_qkv(1, 2, 3, 5, 4, 2, dtype=torch.float64, requires_grad=True)
    r = torch.tensor(0.9, dtype=torch.float64)
    x = r * (q.unsqueeze(-2) - k.unsqueeze(-3))
    sinc = torch.sin(x) / x
    phis = {
        ("power", 3): sinc**3,
        ("abs", 1): sinc.abs(),
        ("relu", 1): sinc.clamp_min(0),
        ("sigmoid", 1): torch.sigmoid(sinc),
    }
    for (phi, power), elementwise in phis.items():
        w = elementwise.prod(-1)
        expected = (w @ v) / w.sum(-1, keepdim=True)
        out = fourier_attention(q, k, v, r, phi=phi, power=power, backend="reference")
        torch.testing.assert_close(out, expected)
        if not CPU_FUSED:
            continue
        # (float64: the scalar kernel; every one of these phis runs on the CPU, odd p included)
        torch.testing.assert_close(fourier_attention(q, k, v, r, phi=phi, power=power, backend="cpu"), expected)


def test_bad_inputs_raise_clear_errors():
    q, k, v = random_qkv(2, 2, 3, 4, 5, 6, dtype=torch.float32)
    r = torch.tensor(1.0)
    cases = [
        (dict(q=q[0]), ValueError, "q must be 4-D"),
        (dict(k=k[:, :, :, :2]), ValueError, "k has shape"),
        (dict(v=v[:, :, :2]), ValueError, "v has shape"),
        (dict(radius=torch.ones(3)), ValueError, "radius has shape"),
        (dict(power=0), ValueError, "power must be a positive integer"),
        (dict(power=2.5), ValueError, "power must be a positive integer"),
        (dict(phi="tanh"), ValueError, "phi must be one of"),
        (dict(attn_mask=torch.zeros(3, 3)), ValueError, "attn_mask has shape"),
        (dict(key_padding_mask=torch.zeros(2, 3, dtype=torch.bool)), ValueError, "key_padding_mask has shape"),
        (dict(dropout_p=1.0), ValueError, "dropout_p"),
        (dict(backend="tpu"), ValueError, "unknown backend"),
        (dict(k=k.double()), TypeError, "share a dtype"),
    ]
    for override, exc, message in cases:
        args = dict(q=q, k=k, v=v, radius=r)
        args.update(override)
        with pytest.raises(exc, match=message):
            fourier_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("radius"), **args)
    with pytest.raises(ValueError, match="causal attention needs N <= M"):
        fourier_attention(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), r, causal=True)


# NaN and infinities. The formula's row is NaN where a NaN or infinite input enters it: its query,
# a key it sees (sinc of an infinite argument is NaN), the radius, a NaN or +inf additive mask
# entry it sees, or the value of a key it sees; so are the gradients that row feeds (its dq, dk and
# dv of the keys it sees, the radius's). A masked key's NaN reaches no row. The fused CPU op must
# give NaN exactly where the float64 oracle does, through the short-query forward (N < 8) and the
# row-group forward, and leave every other entry as it would be; so must the reference.
@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N", [1, 5, 9])
@pytest.mark.parametrize("where", NONFINITE)
def test_nonfinite_inputs_give_nan_where_the_formula_does(where, N, causal, dtype, backend):
    if backend == "cpu" and not CPU_FUSED:
        pytest.skip(f"fused CPU kernel: {backend_unavailable_reason('cpu')}")
    if where == "v_nan" and causal:
        pytest.skip("the oracle's P @ V spreads a value's NaN to the rows that do not see its key (0 * NaN)")
    q, k, v, radius, grad_out, kwargs = nonfinite_case(where, N, causal)
    expected = oracle_gradients(q, k, v, radius, grad_out, **kwargs)
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v, radius)]
    out = fourier_attention(*leaves, backend=backend, **kwargs)
    got = (out,) + torch.autograd.grad(out, leaves, grad_out.to(dtype))
    assert expected[0].isnan().any() == (where != "padded_k_nan")
    for name, a, b in zip(("out", "dq", "dk", "dv", "dradius"), got, expected):
        if where == "mask_pos_inf" and name in ("dk", "dv"):
            # torch's softmax of a +inf score: exp(inf) / inf is NaN, exp(s) / inf is 0, so the
            # oracle's row is NaN but its keys' gradients are NaN at the +inf key only; the op
            # gives a NaN row the gradients of every NaN row (NaN at every key it sees)
            continue
        nan_a, nan_b = a.isnan(), b.isnan()
        assert torch.equal(nan_a, nan_b), f"{name}: NaN at {nan_a.nonzero().tolist()}, the formula at {nan_b.nonzero().tolist()}"
        torch.testing.assert_close(a.detach().double()[~nan_a], b[~nan_b], rtol=1e-3, atol=1e-4, msg=name)


from cpu_variants import REQUESTED_ISA, variant_params  # noqa: E402


@needs_cpu_kernel
@pytest.mark.skipif(REQUESTED_ISA is None, reason="runs in the subprocesses of test_every_cpu_kernel_variant")
def test_requested_cpu_kernel_variant_is_in_use():
    from fourierformer_fairseq.ops.extension import extension_status

    assert extension_status().build["cpu_isa"] == REQUESTED_ISA


# Every instruction-set variant of the float32 kernels this CPU can run (the best one is what
# every other test uses): the float32 accuracy and exact-case tests, again, in a subprocess
# with FOURIERFORMER_CPU_ISA set.


@needs_cpu_kernel
@pytest.mark.skipif(REQUESTED_ISA is not None, reason="already a variant's subprocess")
@pytest.mark.parametrize("isa", variant_params())
def test_every_cpu_kernel_variant(isa):
    selection = (
        "requested_cpu_kernel_variant or cpu_forward_float32 or cpu_gradients_float32 or all_keys_equal "
        "or query_equal_to_a_key or sinc_zeros or keys_at_the_floor or underflow or fully_masked or mask_forms "
        "or dropout or need_weights or every_power_radius or head_dims or large_angles or empty_batch or workspace_above "
        "or non_contiguous or thread_count or negative_zero_and_tiny_radius or zero_radius or nonfinite"
    )
    env = dict(os.environ, FOURIERFORMER_CPU_ISA=isa)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-x", "-p", "no:cacheprovider", __file__, "-k", selection],
        capture_output=True, text=True, timeout=1200, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "test_requested_cpu_kernel_variant_is_in_use PASSED" in result.stdout


# The radius through zero. It is a free learnable parameter (only its init is positive), so
# training can move it to 0 or below. sinc is even, so R and -R give the same weights, the
# same dq, dk, dv, and opposite radius gradients; R = 0 makes every factor sinc(0) = 1, so the
# weights are uniform over the visible keys (out = their mean value) and R = 0 is a stationary
# point (dradius = 0, and dq = dk = 0). The float32 CPU kernel works on |R| and puts the sign
# back into the radius gradient; below |R| = 1e-9 it takes a feature's factor as 1 (its
# error, (R u)^2 / 6, is below float32's resolution) but still its gradients, -R^2 u / 3 for
# q and -R u^2 / 3 for R per unit of p dL/dS (g's series). The bound for near-zero radii is
# oracle_mismatches' with series=True: every |x| is tiny there, where the plain quotient's
# derivative cancels and would allow an error as large as the gradient itself.
RADIUS_VALUES = ("negative", "mixed_sign", "near_zero", "tiny", "zero")


def signed_radius(kind, value_kind, H, D, seed):
    g = torch.Generator().manual_seed(seed)
    shape = {"scalar": (), "head": (H, 1), "feature": (D,), "head_feature": (H, D)}[kind]
    magnitude = 0.7 + 0.6 * torch.rand(shape, generator=g)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    if value_kind == "negative":
        return -1.5 * magnitude
    if value_kind == "mixed_sign":  # (a scalar: negative)
        return 1.5 * magnitude * (sign if shape else -1.0)
    if value_kind == "near_zero":  # above the kernel's flat-feature threshold 1e-9
        return 1e-6 * magnitude * sign
    if value_kind == "tiny":  # below it, and 0 itself where there are several entries
        r = 1e-10 * magnitude * sign
        return r.flatten().index_fill(0, torch.tensor([0]), 0.0).reshape(shape) if shape and r.numel() > 1 else r
    return torch.zeros(shape)


def radius_backends():
    return [("reference", torch.float32), ("reference", torch.float64)] + (
        [("cpu", torch.float32), ("cpu", torch.float64)] if CPU_FUSED else [])


@pytest.mark.parametrize("backend,dtype", radius_backends(), ids=lambda x: str(x).replace("torch.", ""))
@pytest.mark.parametrize("value_kind", RADIUS_VALUES)
@pytest.mark.parametrize("radius_kind", RADIUS_SHAPES)
def test_negative_zero_and_tiny_radius_against_the_oracle(radius_kind, value_kind, backend, dtype):
    B, H, N, M, D, Dv = 2, 2, 5, 9, 8, 3
    seed = RADIUS_SHAPES.index(radius_kind) * 10 + RADIUS_VALUES.index(value_kind)
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=seed)
    r = signed_radius(radius_kind, value_kind, H, D, seed)
    grad_out = torch.randn(B, H, N, Dv, generator=torch.Generator().manual_seed(seed + 1))
    kwargs = dict(power=4, causal=True) if seed % 2 else dict(power=2, key_padding_mask=torch.arange(M).expand(B, M) >= M - 2)
    leaves = [t.to(dtype).clone().requires_grad_() for t in (q, k, v, r)]
    out = fourier_attention(*leaves, backend=backend, **kwargs)
    ours = (out.detach(), *torch.autograd.grad(out, leaves, grad_out.to(dtype)))
    what = f"{backend} {dtype} {radius_kind} {value_kind} R={r.flatten()[:4].tolist()}"
    if dtype == torch.float32:
        bad = oracle_mismatches(ours, q, k, v, r, grad_out, series=True, **kwargs)
        assert not bad, what + ": " + "; ".join(bad)
    else:  # float64: within 1e-9 of each result's scale (as the fuzz's float64 check)
        exact = oracle_gradients(q, k, v, r, grad_out, **kwargs)
        scales = oracle_gradient_scales(q, k, v, r, grad_out, **kwargs)
        for name, a, x, scale in zip(("out", "dq", "dk", "dv", "dradius"), ours, exact, scales):
            err = (a - x).abs().max().item()
            assert err <= 1e-9 * scale + 1e-300, f"{what} {name}: error {err:.3e} > 1e-9 x scale {scale:.3e}"


@pytest.mark.parametrize("backend,dtype", radius_backends(), ids=lambda x: str(x).replace("torch.", ""))
def test_zero_radius_gives_the_mean_of_the_visible_values_and_is_stationary(backend, dtype):
    # R = 0: sinc(0) = 1 in every feature, so every visible key weighs the same; the output is
    # the mean of the visible values, dv_j = sum_i dO_i / (visible keys of i), and dq, dk and
    # dradius are exactly 0 (sinc is even in R: R = 0 is a stationary point)
    B, H, N, M, D, Dv = 2, 2, 6, 11, 16, 4
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=31, to=dtype)
    kpm = torch.zeros(B, M, dtype=torch.bool)
    kpm[1, :3] = True
    grad_out = torch.randn(B, H, N, Dv, generator=torch.Generator().manual_seed(32), dtype=torch.float64).to(dtype)
    visible = ~(oracle_additive_mask(B, H, N, M, key_padding_mask=kpm, causal=True) == float("-inf"))
    P = visible.double() / visible.double().sum(-1, keepdim=True)  # uniform over the visible keys
    for shape in ((), (H, 1), (D,), (H, D)):
        leaves = [q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_(),
                  torch.zeros(shape, dtype=dtype, requires_grad=True)]
        out, weights = fourier_attention(*leaves, key_padding_mask=kpm, causal=True, need_weights=True, backend=backend)
        dq, dk, dv, dr = torch.autograd.grad(out, leaves, grad_out)
        tol = dict(rtol=0, atol=4 * torch.finfo(dtype).eps * M)  # a mean of M values, rounded per step
        torch.testing.assert_close(weights.double(), P, **tol)
        torch.testing.assert_close(out.double(), P @ v.double(), **tol)
        torch.testing.assert_close(dv.double(), P.transpose(-1, -2) @ grad_out.double(), **tol)
        for name, grad in (("dq", dq), ("dk", dk), ("dradius", dr)):
            assert (grad == 0).all(), f"{backend} {dtype} radius shape {shape}: {name} {grad.abs().max().item():.3e}"


@needs_cpu_kernel
@pytest.mark.parametrize("N", [3, 13], ids=["short_query", "row_groups"])
def test_need_weights_and_output_come_from_one_call_where_they_fit(N, monkeypatch):
    """Where v and the identity fit the kernel's value width together, need_weights takes one
    kernel call, [v | I]: its output is bit for bit the call without weights, and its weights
    those of the identity's calls of their own (WEIGHTS_COLUMNS below M), dropout and the null
    key included; with a key table too."""
    from fourierformer_fairseq.ops import fused, key_table

    B, H, M, D, Dv = 2, 2, 21, 16, 5
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=47)
    r = torch.tensor(0.9)
    kw = dict(power=4, causal=True, dropout_p=0.25, normaliser_eps=1e-3, backend="cpu")
    calls = []
    real = fused.fused_forward
    monkeypatch.setattr(fused, "fused_forward", lambda *a, **k_: calls.append(1) or real(*a, **k_))

    def run(**extra):
        with torch.random.fork_rng():
            torch.manual_seed(3)
            return fourier_attention(q, k, v, r, **kw, **extra)

    out, weights = run(need_weights=True)
    assert len(calls) == 1, f"{len(calls)} kernel calls for the output and the weights"
    assert torch.equal(out, run())
    monkeypatch.setattr(fused, "WEIGHTS_COLUMNS", M - 1)  # the identity in calls of its own
    calls.clear()
    out_apart, weights_apart = run(need_weights=True)
    assert len(calls) == 3 and torch.equal(out_apart, out) and torch.equal(weights_apart, weights)
    monkeypatch.setattr(fused, "WEIGHTS_COLUMNS", None)
    table = key_table(k, room=M + 5)
    out_t, weights_t = run(need_weights=True, key_table=table)
    assert torch.equal(out_t, out) and torch.equal(weights_t, weights)


@needs_cpu_kernel
def test_fused_need_weights_come_from_the_kernel(monkeypatch):
    # The fused backend's need_weights returns its kernel's weights, not the reference's (which
    # it once did, so that comparing them with the reference compared the reference with
    # itself): with the reference's weight functions disabled it still returns them.
    import fourierformer_fairseq.ops as ops
    import fourierformer_fairseq.ops.reference as reference

    def refuse(*args, **kwargs):
        raise AssertionError("the reference computed the weights of a fused call")

    for module, name in ((ops, "attention_weights"), (reference, "attention_weights"), (reference, "log_weights")):
        monkeypatch.setattr(module, name, refuse)
    B, H, N, M, D = 1, 2, 4, 6, 8
    q, k, v = random_qkv(B, H, N, M, D, 3, dtype=torch.float32, seed=43)
    out, weights = fourier_attention(q, k, v, torch.tensor(1.1), causal=True, need_weights=True, backend="cpu")
    assert weights.shape == (B, H, N, M)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, N))
