"""The op against its float64 reference, on every backend this machine has.

Tolerance rule (flash-attention's): a backend's error against the float64 reference is at
most 2x the error of the pure-PyTorch reference run in the backend's own precision, plus
a small absolute slack.
"""
import itertools
import math
import os
import subprocess
import sys

import pytest
import torch

from fourierformer_fairseq.ops import (
    backend_unavailable_reason,
    dropout_keep_mask,
    fourier_attention,
    fourier_attention_reference,
)

CPU_FUSED = not backend_unavailable_reason("cpu")
needs_cpu_kernel = pytest.mark.skipif(not CPU_FUSED, reason=f"fused CPU kernel: {backend_unavailable_reason('cpu')}")

RADIUS_SHAPES = ("scalar", "head", "feature", "head_feature")


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


def make_inputs(B, H, N, M, D, Dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, M, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, M, Dv, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v)]


def to64(ts):
    return [t.detach().double().requires_grad_(t.requires_grad) for t in ts]


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def check_2x(ours, same_precision, exact, what, atol):
    err, base = max_err(ours, exact), max_err(same_precision, exact)
    assert err <= 2 * base + atol, f"{what}: error {err:.3e} > 2 x {base:.3e} + {atol:.1e}"


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
    power = (2, 4, 6)[case % 3]
    causal = N <= M and case % 2 == 0
    B, H, Dv = 2, 2, 5 if D != 16 else 16
    q, k, v = make_inputs(B, H, N, M, D, Dv, torch.float32, seed=case)
    r = make_radius(radius_kind, H, D, torch.float32, value=1.0 / math.sqrt(max(D, 1) / 16))
    kpm = torch.zeros(B, M, dtype=torch.bool)
    if M > 1:
        kpm[1, -(M // 3 + 1):] = True
    kwargs = dict(power=power, key_padding_mask=kpm, causal=causal)
    with torch.no_grad():
        ours = fourier_attention(q, k, v, r, backend="cpu", **kwargs)
        same = fourier_attention_reference(q, k, v, r, **kwargs)
        exact = fourier_attention_reference(*to64([q, k, v, r]), **kwargs)
    assert torch.isfinite(ours).all()
    check_2x(ours, same, exact, f"out ({radius_kind}, p={power}, causal={causal})", atol=2e-6)


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
    q, k, v = make_inputs(B, H, N, M, D, Dv, torch.float32, seed=N + M + D)
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
    check_2x(out, out_s, out_x, "out", atol=2e-6)
    for name, g, gs, gx in zip("qkvr", grads, grads_s, grads_x):
        assert g.shape == gx.shape and g.dtype == torch.float32
        scale = max(1.0, gx.abs().max().item())
        check_2x(g, gs, gx, f"grad {name}", atol=2e-5 * scale)


@needs_cpu_kernel
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("radius_kind", RADIUS_SHAPES)
def test_cpu_float64_equals_reference_and_passes_gradcheck(causal, radius_kind):
    B, H, N, M, D, Dv = 2, 2, 5, 7, 3, 4
    q, k, v = make_inputs(B, H, N, M, D, Dv, torch.float64, seed=3)
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
    q, k, v = make_inputs(B, H, N, M, D, 3, torch.float64, seed=5)
    r = make_radius("head", H, D, torch.float64)
    for phi, power in (("power", 4), ("power", 3), ("abs", 1), ("relu", 1), ("sigmoid", 1)):
        fn = lambda *t: fourier_attention_reference(*t, phi=phi, power=power)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k, v, r)), (phi, power)


@needs_cpu_kernel
def test_opcheck_forward_op():
    B, H, N, M, D, Dv = 2, 2, 5, 6, 4, 3
    for dtype in (torch.float32, torch.float64):
        q, k, v = make_inputs(B, H, N, M, D, Dv, dtype)
        r = torch.full((H, D), 1.3, dtype=dtype, requires_grad=True)
        mask = torch.zeros(1, H, N, M, dtype=dtype)
        mask[..., 1] = float("-inf")
        bias = torch.zeros(B, M, dtype=dtype)
        args = (q, k, v, r, 4.0, mask, bias, True, 0.0, 0)
        torch.library.opcheck(torch.ops.fourierformer.fourier_attention_forward.default, args)
        torch.library.opcheck(
            torch.ops.fourierformer.fourier_attention_forward.default, (q, k, v, r, 2.0, None, None, False, 0.0, 0)
        )


@needs_cpu_kernel
def test_torch_compile_runs_the_fused_op():
    q, k, v = make_inputs(2, 2, 9, 9, 16, 16, torch.float32)
    r = torch.tensor(2.0, requires_grad=True)
    compiled = torch.compile(lambda *t: fourier_attention(*t, causal=True, backend="cpu"), backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v, r)
    out.sum().backward()
    expected = fourier_attention(q, k, v, r, causal=True, backend="cpu")
    torch.testing.assert_close(out, expected)
    assert r.grad is not None and torch.isfinite(r.grad).all()


def backends_here():
    return ["reference"] + (["cpu"] if CPU_FUSED else [])


@pytest.mark.parametrize("backend", backends_here())
def test_all_keys_equal_gives_mean_of_values(backend):
    B, H, N, M, D = 1, 2, 4, 9, 16
    q = torch.randn(B, H, N, D)
    k = torch.randn(B, H, 1, D).expand(B, H, M, D).contiguous()
    v = torch.randn(B, H, M, 5)
    out = fourier_attention(q, k, v, torch.tensor(1.5), backend=backend)
    torch.testing.assert_close(out, v.mean(2, keepdim=True).expand_as(out), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", backends_here())
def test_query_equal_to_a_key_at_large_radius_returns_that_value(backend):
    B, H, M, D = 1, 1, 12, 16
    k = torch.randn(B, H, M, D)
    v = torch.randn(B, H, M, 3)
    q = k[:, :, 5:6].clone()
    out = fourier_attention(q, k, v, torch.tensor(40.0), backend=backend)
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
        exact = fourier_attention_reference(*to64([q, k, v, r]), key_padding_mask=kpm)
    assert torch.isfinite(ours).all()
    check_2x(ours, same, exact, "out", atol=2e-6)


@pytest.mark.parametrize("backend", backends_here())
def test_sinc_zeros_and_q_equal_k_are_finite(backend):
    # x = R (q - k) lands exactly on 0 and near the zeros n * pi of sinc
    D = 4
    k = torch.zeros(1, 1, 5, D)
    q = torch.zeros(1, 1, 3, D)
    k[0, 0, 1, :] = math.pi
    k[0, 0, 2, 0] = 2 * math.pi
    k[0, 0, 3, :2] = -math.pi
    v = torch.randn(1, 1, 5, 2)
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
        same = fourier_attention_reference(q, k, v, r, power=4)
        exact = fourier_attention_reference(*to64([q, k, v, r]), power=4)
    assert exact[0, 0, 0, 0] > 0.99
    check_2x(ours, same, exact, "out", atol=1e-6)


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
        same = fourier_attention_reference(q, k, v, r, power=4, causal=causal)
        exact = fourier_attention_reference(*to64([q, k, v, r]), power=4, causal=causal)
    assert torch.isfinite(ours).all()
    check_2x(ours, same, exact, "out", atol=2e-6)


def published_fourier_attention(q, k, v, r, p):
    """The published code's approach: product of sincs in the linear domain, + 1e-6."""
    x = r * (q.unsqueeze(-2) - k.unsqueeze(-3))
    w = (torch.sin(x) / x).pow(p).prod(-1)
    return (w @ v) / (w.sum(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("backend", backends_here())
def test_no_underflow_at_head_dim_128(backend):
    B, H, N, D = 1, 2, 16, 128
    q, k, v = (t.detach() for t in make_inputs(B, H, N, N, D, 8, torch.float32, seed=9))
    r = torch.tensor(1.0)
    published = published_fourier_attention(q, k, v, r, 4)
    assert published.abs().max() < 1e-3, "the linear-domain product should underflow here"
    ours = fourier_attention(q, k, v, r, power=4, backend=backend)
    exact = fourier_attention_reference(q.double(), k.double(), v.double(), r.double(), power=4)
    assert ours.abs().max() > 0.1
    torch.testing.assert_close(ours.double(), exact, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", backends_here())
def test_fully_masked_rows_give_zero_output_and_gradient(backend):
    B, H, N, M, D = 2, 2, 4, 6, 8
    q, k, v = make_inputs(B, H, N, M, D, 3, torch.float32)
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
    q, k, v = (t.detach() for t in make_inputs(B, H, N, M, D, 3, torch.float32))
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
def test_dropout_matches_reference_mask_and_is_unbiased(backend):
    B, H, N, M, D, p = 2, 2, 6, 40, 8, 0.3
    q, k, v = make_inputs(B, H, N, M, D, 4, torch.float32)
    r = torch.tensor(0.5, requires_grad=True)
    torch.manual_seed(123)
    out, weights = fourier_attention(q, k, v, r, dropout_p=p, need_weights=True, backend=backend)
    torch.manual_seed(123)
    ref, ref_weights = fourier_attention_reference(q, k, v, r, dropout_p=p, need_weights=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights, ref_weights)
    dropped = (weights == 0).float().mean().item()
    assert abs(dropped - p) < 0.08
    g_out = torch.autograd.grad(out.sum(), (q, k, v, r))
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v, r))
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    keep = dropout_keep_mask(7, (B, H, N, M), p, "cpu")
    assert abs(keep.float().mean().item() - (1 - p)) < 0.05


def test_odd_power_and_other_phis_run_on_the_reference_only():
    q, k, v = make_inputs(1, 2, 3, 5, 4, 2, torch.float64)
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
        out = fourier_attention(q, k, v, r, phi=phi, power=power)  # auto -> reference
        torch.testing.assert_close(out, expected)
        if CPU_FUSED:
            with pytest.raises(ValueError, match="even p"):
                fourier_attention(q, k, v, r, phi=phi, power=power, backend="cpu")


def test_bad_inputs_raise_clear_errors():
    q, k, v = (t.detach() for t in make_inputs(2, 2, 3, 4, 5, 6, torch.float32))
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
        fourier_attention(torch.randn(1, 1, 5, 2), torch.randn(1, 1, 3, 2), torch.randn(1, 1, 3, 2), r, causal=True)


def run_python(code, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)


def test_without_the_extension_everything_runs_on_the_reference():
    code = (
        "import torch\n"
        "from fourierformer_fairseq.ops import fourier_attention, select_backend\n"
        "from fourierformer_fairseq.ops.inputs import prepare_inputs\n"
        "q = torch.randn(1, 1, 3, 2); r = torch.tensor(1.0)\n"
        "print('auto ->', select_backend('auto', prepare_inputs(q, q, q, r)))\n"
        "print(fourier_attention(q, q, q, r).shape)\n"
        "try:\n    fourier_attention(q, q, q, r, backend='cpu')\nexcept ValueError as e:\n    print('cpu:', e)\n"
    )
    result = run_python(code, FOURIERFORMER_DISABLE_EXTENSION="1")
    assert result.returncode == 0, result.stderr
    assert "auto -> reference" in result.stdout
    assert "torch.Size([1, 1, 3, 2])" in result.stdout
    assert "cpu:" in result.stdout and "FOURIERFORMER_DISABLE_EXTENSION" in result.stdout


def test_info_reports_backends():
    result = subprocess.run(
        [sys.executable, "-m", "fourierformer_fairseq.info"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert f"torch {torch.__version__}" in result.stdout
    cpu_line = next(line for line in result.stdout.splitlines() if line.strip().startswith("cpu"))
    assert ("unavailable" not in cpu_line) == CPU_FUSED


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


REQUESTED_ISA = os.environ.get("FOURIERFORMER_CPU_ISA")


@needs_cpu_kernel
@pytest.mark.skipif(REQUESTED_ISA is None, reason="runs in the subprocesses of test_every_cpu_kernel_variant")
def test_requested_cpu_kernel_variant_is_in_use():
    from fourierformer_fairseq.ops.extension import extension_status

    assert extension_status().build["cpu_isa"] == REQUESTED_ISA


# Every instruction-set variant of the float32 kernels this CPU can run (the best one is what
# every other test uses): the float32 accuracy and exact-case tests, again, in a subprocess
# with FOURIERFORMER_CPU_ISA set.
OTHER_ISAS = [
    isa
    for isa, flags in (("avx2", ("avx2", "fma")), ("generic", ()))
    if all(f in cpu_flags() for f in flags)
]


@pytest.mark.slow
@needs_cpu_kernel
@pytest.mark.skipif(REQUESTED_ISA is not None, reason="already a variant's subprocess")
@pytest.mark.parametrize("isa", OTHER_ISAS)
def test_every_cpu_kernel_variant(isa):
    selection = (
        "requested_cpu_kernel_variant or cpu_forward_float32 or cpu_gradients_float32 or all_keys_equal "
        "or query_equal_to_a_key or sinc_zeros or keys_at_the_floor or underflow or fully_masked or mask_forms "
        "or dropout"
    )
    env = dict(os.environ, FOURIERFORMER_CPU_ISA=isa)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-x", "-p", "no:cacheprovider", __file__, "-k", selection],
        capture_output=True, text=True, timeout=1200, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "test_requested_cpu_kernel_variant_is_in_use PASSED" in result.stdout
