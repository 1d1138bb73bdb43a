"""The fused CUDA kernels (csrc/cuda) against the pure-PyTorch reference.

Needs a CUDA device and an extension compiled with CUDA; skipped entirely otherwise.

Accuracy rule: the error of the kernel (relative Frobenius norm against the float64
reference) is at most twice that of the reference run in the same precision on the GPU,
plus a small tolerance per dtype.
"""
from __future__ import annotations

import math
import zlib

import pytest
import torch

pytestmark = pytest.mark.cuda


def _cuda_kernels_missing() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device"
    from fourierformer_fairseq.ops.extension import extension_status

    status = extension_status()
    if not status.loaded:
        return f"extension not loaded: {status.reason}"
    if not torch._C._dispatch_has_kernel_for_dispatch_key("fourierformer::fourier_attention_forward", "CUDA"):
        return "the extension has no CUDA kernels (built without CUDA)"
    return ""


_REASON = _cuda_kernels_missing()
if _REASON:
    pytest.skip(_REASON, allow_module_level=True)

from fourierformer_fairseq.ops import fourier_attention, fourier_attention_reference  # noqa: E402
from helpers import norm_relative_error, random_qkv  # noqa: E402

DEV = torch.device("cuda")
NAMES = ("out", "dq", "dk", "dv", "dradius")
# Allowed error on top of 2x the same-precision reference's.
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
# Bound used where that reference is not finite itself (the float16 reference's gradients
# overflow). dradius gets more room: it sums dx (q - k) over b, i, j (and d for a scalar or
# per-head radius) with heavy cancellation.
FALLBACK = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
FALLBACK_DRADIUS = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 5e-2, torch.bfloat16: 2e-1}


def _radius(kind: str, H: int, D: int, g: torch.Generator) -> torch.Tensor:
    """kind: a shape (scalar, head, feature, full), positive; or "negative-", "mixed-" (random
    signs) or "zero-" and a shape (the radius may cross 0 in training)."""
    value, _, shape_kind = kind.rpartition("-")
    shape = {"scalar": (), "head": (H, 1), "feature": (D,), "full": (H, D)}[shape_kind]
    r = 0.5 + torch.rand(shape, generator=g, dtype=torch.float64)
    if value == "negative":
        r = -r
    elif value == "mixed":
        r = r * torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
    elif value == "zero":
        r = torch.zeros(shape, dtype=torch.float64)
    return r


def _masks(kind: str, B: int, H: int, N: int, M: int, g: torch.Generator):
    """(attn_mask, key_padding_mask) on the GPU for a mask kind."""
    if kind == "none":
        return None, None
    if kind == "bool":  # (N, M), True = not attended
        m = torch.rand(N, M, generator=g) < 0.3
        m[:, 0] = False
        return m.to(DEV), None
    if kind == "float":  # additive (B*H, N, M) with finite values and -inf
        m = torch.randn(B * H, N, M, generator=g, dtype=torch.float64)
        m = m.masked_fill(torch.rand(B * H, N, M, generator=g) < 0.2, float("-inf"))
        return m.float().double().to(DEV), None  # values the kernel's float32 mask holds exactly
    if kind == "padding":  # key_padding_mask (B, M)
        m = torch.rand(B, M, generator=g) < 0.25
        m[:, 0] = False
        return None, m.to(DEV)
    if kind == "batch4d":  # (B, 1, N, M) bool plus padding
        m = torch.rand(B, 1, N, M, generator=g) < 0.2
        p = torch.rand(B, M, generator=g) < 0.2
        p[:, -1] = False
        return m.to(DEV), p.to(DEV)
    raise ValueError(kind)


def _problem(B, H, N, M, D, Dv, radius_kind, mask_kind, seed, dtype=torch.float32, scale=1.0):
    """Inputs as float64 holding values exactly representable in dtype (radius: in float32), so
    that every run sees the same numbers and errors measure the arithmetic only."""
    g = torch.Generator().manual_seed(seed)

    def rounded(t, to=dtype):
        return t.to(to).double()

    q, k, v = random_qkv(B, H, N, M, D, Dv, generator=g, dtype=torch.float64, scale=scale)
    base = {
        "q": rounded(q),
        "k": rounded(k),
        "v": rounded(v),
        "radius": rounded(_radius(radius_kind, H, D, g), torch.float32),
        "dout": rounded(torch.randn(B, H, N, Dv, generator=g, dtype=torch.float64)),
    }
    base["attn_mask"], base["key_padding_mask"] = _masks(mask_kind, B, H, N, M, g)
    return base


def _run(fn, base, dtype, radius_dtype, **kw):
    """Output and gradients (q, k, v, radius) of fn, as float64."""
    q, k, v = (base[n].to(DEV, dtype, copy=True).requires_grad_(True) for n in ("q", "k", "v"))
    radius = base["radius"].to(DEV, radius_dtype, copy=True).requires_grad_(True)
    out = fn(q, k, v, radius, attn_mask=base["attn_mask"], key_padding_mask=base["key_padding_mask"], **kw)
    out.backward(base["dout"].to(DEV, out.dtype))
    return [t.detach().double() for t in (out, q.grad, k.grad, v.grad, radius.grad)]


def _cuda(q, k, v, radius, **kw):
    return fourier_attention(q, k, v, radius, backend="cuda", **kw)


def _check(got, same, ref, dtype, what):
    for name, g, s, r in zip(NAMES, got, same, ref):
        assert g.shape == r.shape, f"{what}: {name} shape {tuple(g.shape)} != {tuple(r.shape)}"
        assert torch.isfinite(g).all(), f"{what}: {name} is not finite"
        if r.norm() == 0:
            assert g.abs().max() <= 1e-6, f"{what}: {name} should be zero"
            continue
        e_kernel, e_same = norm_relative_error(g, r), norm_relative_error(s, r)
        fallback = (FALLBACK_DRADIUS if name == "dradius" else FALLBACK)[dtype]
        bound = 2 * e_same + ATOL[dtype] if math.isfinite(e_same) else fallback
        assert e_kernel <= bound, (
            f"{what}: {name}: kernel error {e_kernel:.2e} > {bound:.2e} "
            f"(the {dtype} reference's error is {e_same:.2e})"
        )


# (B, H, N, M, D, Dv, radius, power, causal, mask, dtype)
CASES = [
    (1, 1, 1, 1, 1, 1, "scalar", 2, False, "none", torch.float32),
    (2, 2, 7, 7, 16, 16, "head", 4, False, "bool", torch.float32),
    (2, 2, 7, 97, 16, 24, "full", 4, True, "none", torch.float32),
    (1, 2, 97, 97, 59, 59, "feature", 6, False, "float", torch.float32),
    (2, 2, 97, 256, 128, 64, "full", 4, True, "padding", torch.float32),
    (1, 2, 256, 256, 128, 128, "head", 2, False, "batch4d", torch.float32),
    (2, 1, 256, 7, 59, 33, "scalar", 4, False, "padding", torch.float32),
    (1, 2, 1, 256, 1, 5, "full", 6, True, "none", torch.float32),
    (1, 1, 7, 97, 256, 256, "full", 2, False, "none", torch.float32),
    (2, 2, 97, 97, 16, 16, "full", 4, True, "bool", torch.float16),
    (1, 2, 256, 97, 59, 64, "feature", 6, False, "float", torch.float16),
    (2, 2, 7, 256, 128, 128, "head", 4, True, "padding", torch.float16),
    (2, 2, 97, 97, 16, 16, "full", 4, False, "batch4d", torch.bfloat16),
    (1, 2, 97, 256, 128, 64, "scalar", 2, True, "none", torch.bfloat16),
    (2, 1, 256, 256, 59, 32, "full", 6, False, "bool", torch.bfloat16),
    (2, 2, 7, 97, 16, 24, "full", 4, True, "padding", torch.float64),
    (1, 2, 97, 97, 59, 59, "feature", 6, False, "float", torch.float64),
    (2, 2, 7, 97, 16, 24, "negative-full", 4, True, "none", torch.float32),
    (1, 2, 33, 40, 59, 16, "mixed-feature", 2, False, "padding", torch.float32),
    (2, 2, 17, 33, 16, 16, "zero-head", 4, True, "bool", torch.float32),
    (2, 2, 7, 97, 16, 24, "mixed-full", 4, True, "padding", torch.float64),
]


def _case_id(c):
    B, H, N, M, D, Dv, radius, power, causal, mask, dtype = c
    kind = "causal" if causal else "full"
    return f"{str(dtype).split('.')[-1]}-N{N}-M{M}-D{D}-Dv{Dv}-{radius}-p{power}-{kind}-{mask}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_matches_reference(case):
    B, H, N, M, D, Dv, radius_kind, power, causal, mask_kind, dtype = case
    seed = zlib.crc32(_case_id(case).encode()) % 1000
    base = _problem(B, H, N, M, D, Dv, radius_kind, mask_kind, seed, dtype=dtype, scale=0.5)
    kw = dict(power=power, causal=causal)
    ref = _run(fourier_attention_reference, base, torch.float64, torch.float64, **kw)
    same = _run(fourier_attention_reference, base, dtype, torch.float32, **kw)
    got = _run(_cuda, base, dtype, torch.float32, **kw)
    _check(got, same, ref, dtype, _case_id(case))


def _edge_problem(kind, dtype):
    """Inputs that take the float32 path's rare branches: keys that duplicate queries exactly
    (q = k gives 0 / 0 in the tables' ratio) or nearly, keys at sinc's zeros, remainders of the
    64-row and 64-key tiles, negative and zero radius entries, angles |R q| up to ~4e8."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{kind} {dtype}".encode()) % 1000)
    B, H, N, M, D, Dv = {"remainders": (1, 2, 65, 130, 16, 20), "huge": (1, 1, 5, 11, 8, 3)}.get(kind, (2, 2, 33, 70, 16, 16))
    base = _problem(B, H, N, M, D, Dv, "full", "padding" if kind == "remainders" else "none", g.initial_seed(),
                    dtype=dtype, scale=0.5)
    q, k = base["q"], base["k"]
    if kind in ("duplicates", "near", "remainders"):
        q = k[:, :, torch.randint(M, (N,), generator=g)].clone()
        if kind == "near":
            q = (q + 1e-3 * torch.randn(q.shape, generator=g, dtype=torch.float64)).to(dtype).double()
    elif kind == "sinc_zeros":
        radius = base["radius"]
        for _ in range(N * M // 4):
            b, h, i, j, d = (int(torch.randint(n, (1,), generator=g)) for n in (B, H, N, M, D))
            k[b, h, j, d] = q[b, h, i, d] - math.pi / float(radius[h, d])
        k = k.to(dtype).double()
    elif kind == "signs":
        radius = base["radius"].clone()
        radius[0, 1], radius[1, 3], radius[1, 0] = -radius[0, 1], 0.0, -2.0
        base["radius"] = radius
    elif kind == "huge":  # q - k exact in float32 (a grid of 0.5 near 2^22)
        q = 2.0**22 + 0.5 * torch.randint(-8, 9, (B, H, N, D), generator=g).double()
        k = 2.0**22 + 0.5 * torch.randint(-8, 9, (B, H, M, D), generator=g).double()
        k[0, 0, 3] = q[0, 0, 1]
        base["radius"] = torch.full((H, D), 100.0, dtype=torch.float64)
    base["q"], base["k"] = q, k
    return base


EDGE_CASES = [(kind, torch.float32) for kind in ("duplicates", "near", "sinc_zeros", "remainders", "signs", "huge")]
EDGE_CASES += [(kind, dt) for kind in ("duplicates", "remainders") for dt in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("kind,dtype", EDGE_CASES, ids=[f"{k}-{str(d).split('.')[-1]}" for k, d in EDGE_CASES])
@pytest.mark.parametrize("causal", [False, True])
def test_table_path_edge_cases(kind, dtype, causal):
    base = _edge_problem(kind, dtype)
    kw = dict(power=2 if kind == "huge" else 4, causal=causal)
    ref = _run(fourier_attention_reference, base, torch.float64, torch.float64, **kw)
    same = _run(fourier_attention_reference, base, dtype, torch.float32, **kw)
    got = _run(_cuda, base, dtype, torch.float32, **kw)
    _check(got, same, ref, dtype, f"edge case {kind} {dtype} causal={causal}")


@pytest.mark.parametrize("power", [2, 4])
def test_backward_does_not_need_the_forward_bit_for_bit(power):
    """The backward op given the float64 forward's out and lse (rounded as stored) instead of
    the kernel's own: its gradients must be as accurate. dradius sums dS_ij T_ij where T_ij
    has a large part common to a row's keys, so it is only as accurate as sum_j dS_ij is
    close to 0 with the backward's own P; a backward that took Delta_i = dO_i . O_i from the
    stored output, or P normalised by the forward's lse, relied on the forward reproducing
    its scores bit for bit (on an H200 it did not: 8x the float32 reference's dradius error)."""
    case_id = f"forward bit for bit p{power}"
    B, H, N, M, D = 1, 2, 256, 256, 128
    base = _problem(B, H, N, M, D, D, "head", "batch4d", zlib.crc32(case_id.encode()) % 1000, scale=0.5)
    ref = _run(fourier_attention_reference, base, torch.float64, torch.float64, power=power)
    same = _run(fourier_attention_reference, base, torch.float32, torch.float32, power=power)
    q, k, v, dout = (base[n].to(DEV, torch.float32).contiguous() for n in ("q", "k", "v", "dout"))
    radius = base["radius"].expand(H, D).to(DEV, torch.float32).contiguous()
    am, kpm = base["attn_mask"], base["key_padding_mask"]
    fwd, bwd = torch.ops.fourierformer.fourier_attention_forward, torch.ops.fourierformer.fourier_attention_backward
    _, lse64 = fwd(*(t.cpu().double() for t in (q, k, v, radius)), float(power), am.cpu(), kpm.cpu(), False, 0.0, 0)
    out32, lse32 = fwd(q, k, v, radius, float(power), am, kpm, False, 0.0, 0)
    for what, out, lse in (("own", out32, lse32), ("float64", ref[0].float(), lse64.to(DEV))):
        dq, dk, dv, dradius = bwd(dout, q, k, v, radius, out.contiguous(), lse, float(power), am, kpm, False, 0.0, 0)
        got = [out32.double(), dq.double(), dk.double(), dv.double(), dradius.double().sum(1, keepdim=True)]
        _check(got, same, ref, torch.float32, f"{case_id}, {what} out and lse")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_large_arguments(dtype):
    """|x| up to ~100: sinc next to its zeros, where approximate sin would be wrong."""
    base = _problem(1, 2, 33, 65, 8, 8, "full", "none", seed=3, dtype=dtype, scale=20.0)
    ref = _run(fourier_attention_reference, base, torch.float64, torch.float64, power=2)
    same = _run(fourier_attention_reference, base, dtype, torch.float32, power=2)
    got = _run(_cuda, base, dtype, torch.float32, power=2)
    _check(got, same, ref, dtype, f"large arguments {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_rows_are_zero(dtype):
    B, H, N, M, D = 2, 2, 9, 13, 16
    base = _problem(B, H, N, M, D, D, "full", "none", seed=5, dtype=dtype)
    attn_mask = torch.zeros(N, M, dtype=torch.bool)
    attn_mask[2] = True  # query 2 sees no key
    padding = torch.zeros(B, M, dtype=torch.bool)
    padding[1] = True  # batch 1 has only padding
    base["attn_mask"], base["key_padding_mask"] = attn_mask.to(DEV), padding.to(DEV)
    out, dq, dk, dv, dradius = _run(_cuda, base, dtype, torch.float32, power=4)
    for t in (out, dq, dk, dv, dradius):
        assert torch.isfinite(t).all()
    assert (out[:, :, 2] == 0).all() and (out[1] == 0).all()
    assert (dq[:, :, 2] == 0).all() and (dq[1] == 0).all()
    assert (dk[1] == 0).all() and (dv[1] == 0).all()
    ref = _run(fourier_attention_reference, base, torch.float64, torch.float64, power=4)
    same = _run(fourier_attention_reference, base, dtype, torch.float32, power=4)
    _check([out, dq, dk, dv, dradius], same, ref, dtype, f"fully masked rows {dtype}")


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_matches_reference(causal):
    B, H, N, M, D, Dv, p, seed = 2, 2, 37, 50, 16, 12, 0.3, 1234
    base = _problem(B, H, N, M, D, Dv, "full", "padding", seed=11)
    ref = _run(fourier_attention_reference, base, torch.float64, torch.float64, power=4, causal=causal,
               dropout_p=p, seed=seed)
    # the op itself, with an explicit seed
    q, k, v = (base[n].to(DEV, torch.float32) for n in ("q", "k", "v"))
    radius = base["radius"].to(DEV, torch.float32)
    key_bias = torch.zeros(B, M, device=DEV).masked_fill(base["key_padding_mask"], float("-inf"))
    out, lse = torch.ops.fourierformer.fourier_attention_forward(q, k, v, radius, 4.0, None, key_bias, causal, p, seed)
    assert norm_relative_error(out.double(), ref[0]) < 1e-5
    dq, dk, dv, dradius = torch.ops.fourierformer.fourier_attention_backward(
        base["dout"].to(DEV, torch.float32), q, k, v, radius, out, lse, 4.0, None, key_bias, causal, p, seed)
    for name, g, r in zip(NAMES[1:], (dq, dk, dv, dradius), ref[1:]):
        assert norm_relative_error(g.double(), r) < 1e-4, name
    # the public API draws its seed from torch's CPU generator, as the reference does
    torch.manual_seed(77)
    got = _run(_cuda, base, torch.float32, torch.float32, power=4, causal=causal, dropout_p=p)
    torch.manual_seed(77)
    ref = _run(fourier_attention_reference, base, torch.float64, torch.float64, power=4, causal=causal, dropout_p=p)
    for name, g, r in zip(NAMES, got, ref):
        assert norm_relative_error(g, r) < 1e-4, name


def test_float64_op_matches_cpu_backend():
    """float64 is not offered by the public API on CUDA, but the op takes it."""
    base = _problem(2, 2, 19, 41, 24, 10, "full", "none", seed=13)
    args = [base[n] for n in ("q", "k", "v")] + [base["radius"]]
    mask = torch.zeros(2, 1, 19, 41, dtype=torch.float64).masked_fill(
        torch.rand(2, 1, 19, 41, generator=torch.Generator().manual_seed(14)) < 0.3, float("-inf"))
    extra = (6.0, mask, None, True, 0.1, 99)
    out_c, lse_c = torch.ops.fourierformer.fourier_attention_forward(*args, *extra)
    cuda_args = [t.to(DEV) for t in args]
    out_g, lse_g = torch.ops.fourierformer.fourier_attention_forward(*cuda_args, 6.0, mask.to(DEV), None, True, 0.1, 99)
    assert out_g.dtype == torch.float64 and lse_g.dtype == torch.float64
    torch.testing.assert_close(out_g.cpu(), out_c, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse_g.cpu(), lse_c, rtol=1e-12, atol=1e-12)
    dout = base["dout"]
    grads_c = torch.ops.fourierformer.fourier_attention_backward(dout, *args[:3], args[3], out_c, lse_c, *extra)
    grads_g = torch.ops.fourierformer.fourier_attention_backward(
        dout.to(DEV), *cuda_args[:3], cuda_args[3], out_g, lse_g, 6.0, mask.to(DEV), None, True, 0.1, 99)
    for gc, gg in zip(grads_c, grads_g):
        torch.testing.assert_close(gg.cpu(), gc, rtol=1e-9, atol=1e-10)


def test_noncontiguous_inputs_and_side_stream():
    base = _problem(2, 3, 17, 29, 16, 16, "head", "none", seed=17)
    q = base["q"].to(DEV, torch.float32).transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, N, D) views
    k = base["k"].to(DEV, torch.float32).transpose(2, 3).contiguous().transpose(2, 3)
    v = base["v"].to(DEV, torch.float32)
    radius = base["radius"].to(DEV, torch.float32)
    assert not q.is_contiguous() and not k.is_contiguous()
    expected = fourier_attention(q.contiguous(), k.contiguous(), v, radius, backend="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = fourier_attention(q, k, v, radius, backend="cuda")
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_head_dim_limit():
    q = torch.randn(1, 1, 3, 257, generator=torch.Generator().manual_seed(15)).to(DEV)
    radius = torch.ones(1, 257, device=DEV)
    with pytest.raises(RuntimeError, match="head dims"):
        torch.ops.fourierformer.fourier_attention_forward(q, q, q, radius, 4.0, None, None, False, 0.0, 0)


@pytest.mark.parametrize("columns", [None, 7], ids=lambda c: f"columns{c}")
@pytest.mark.parametrize("kind", ["causal_padding", "dropout_null_key"])
def test_need_weights_and_their_gradients_match_reference(kind, columns, monkeypatch):
    """need_weights on CUDA: M = 300 keys, more than the kernel's value width (256), so the
    weights come in chunks of columns (fused_weights) even at the default; columns 7 makes 43
    of them. The weights and the gradients of sum(weights * G) w.r.t. q, k and the radius,
    G random, against the float64 reference, within this file's rule (2x the float32
    reference's error on the GPU + ATOL)."""
    from fourierformer_fairseq.ops import fused

    monkeypatch.setattr(fused, "WEIGHTS_COLUMNS", columns)
    B, H, N, M, D = 2, 2, 33, 300, 16
    base = _problem(B, H, N, M, D, 1, "full", "padding" if kind == "causal_padding" else "none", seed=21)
    kw = dict(power=4, causal=True) if kind == "causal_padding" else dict(power=4, dropout_p=0.3, normaliser_eps=1e-3)
    G = torch.randn(B, H, N, M, generator=torch.Generator().manual_seed(22), dtype=torch.float64)

    def run(fn, dtype):
        q, k = (base[n].to(DEV, dtype, copy=True).requires_grad_(True) for n in ("q", "k"))
        radius = base["radius"].to(DEV, torch.float64 if dtype == torch.float64 else torch.float32,
                                   copy=True).requires_grad_(True)
        torch.manual_seed(9)  # the dropout seed, drawn from torch's CPU generator by every backend
        _, w = fn(q, k, base["v"].to(DEV, dtype), radius, attn_mask=base["attn_mask"],
                  key_padding_mask=base["key_padding_mask"], need_weights=True, **kw)
        w.backward(G.to(DEV, w.dtype))
        return [t.detach().double() for t in (w, q.grad, k.grad, radius.grad)]

    ref = run(fourier_attention_reference, torch.float64)
    same = run(fourier_attention_reference, torch.float32)
    got = run(_cuda, torch.float32)
    for name, g, s, r in zip(("weights", "dq", "dk", "dradius"), got, same, ref):
        assert g.shape == r.shape and torch.isfinite(g).all(), name
        e_kernel, e_same = norm_relative_error(g, r), norm_relative_error(s, r)
        bound = 2 * e_same + ATOL[torch.float32]
        assert e_kernel <= bound, f"{kind} columns {columns}: {name}: kernel error {e_kernel:.2e} > {bound:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_tables_op_on_cuda(dtype):
    """fourier_attention_tables on CUDA: _C.cuda_table_floats elements (none for float64), passing
    opcheck with the forward and backward that take them; the forward with them gives what it
    gives building its own, bit for bit."""
    from fourierformer_fairseq.ops.extension import extension_status

    B, H, N, M, D, Dv = 2, 3, 37, 29, 12, 7
    g = torch.Generator().manual_seed(17)
    q, k = (torch.randn(B, H, n, D, generator=g).to(DEV, dtype) for n in (N, M))
    v = torch.randn(B, H, M, Dv, generator=g).to(DEV, dtype)
    radius = (0.5 + torch.rand(H, D, generator=g)).to(DEV, torch.float64 if dtype == torch.float64 else torch.float32)
    tables = torch.ops.fourierformer.fourier_attention_tables(q, k, radius)
    floats = 0 if dtype == torch.float64 else extension_status().module.cuda_table_floats(B, H, N, M, D)
    assert tables.dtype == torch.float32 and tables.shape == (floats,) and tables.device.type == "cuda"
    torch.library.opcheck(torch.ops.fourierformer.fourier_attention_tables.default, (q, k, radius))
    args = (q, k, v, radius, 4.0, None, None, True, 0.0, 0, 0.0)
    out, lse = torch.ops.fourierformer.fourier_attention_forward(*args)
    out_t, lse_t = torch.ops.fourierformer.fourier_attention_forward(*args, tables)
    assert torch.equal(out, out_t) and torch.equal(lse, lse_t)
    torch.library.opcheck(torch.ops.fourierformer.fourier_attention_forward.default, args + (tables,))
    bwd = (torch.ones_like(out), q, k, v, radius, out, lse, 4.0, None, None, True, 0.0, 0, 0.0, tables)
    torch.library.opcheck(torch.ops.fourierformer.fourier_attention_backward.default, bwd)


def _ops_forward_backward(args, dout, tables=None):
    """(out, lse, dq, dk, dv, dradius) of the ops on `args` (the forward's first eleven)."""
    extra = () if tables is None else (tables,)
    out, lse = torch.ops.fourierformer.fourier_attention_forward(*args, *extra)
    grads = torch.ops.fourierformer.fourier_attention_backward(dout, *args[:4], out, lse, *args[4:], *extra)
    return (out, lse, *grads)


def _assert_same(first, second, what):
    """out, lse, dk, dv bit for bit; dq and dradius (float atomics) to 1e-6 of their largest value."""
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dradius"), first, second):
        if name in ("dq", "dradius"):
            err = (a - b).abs().max().item()
            assert err <= 1e-6 * max(1.0, b.abs().max().item()), f"{what}: {name} differs by {err:.3e}"
        else:
            assert torch.equal(a, b), f"{what}: {name} differs"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tables_as_a_misaligned_view(dtype):
    """Tables passed as a view one float into a larger buffer, off the 16 bytes that the kernels'
    float4 loads of them need (N and M multiples of 4, where the kernels stage them as float4; a
    misaligned address there faults): the op reads an aligned copy, with the results of the tables
    themselves."""
    g = torch.Generator().manual_seed(23)
    B, H, N, M, D, Dv = 2, 2, 40, 68, 16, 8
    q, k = (torch.randn(B, H, n, D, generator=g).to(DEV, dtype) for n in (N, M))
    v = torch.randn(B, H, M, Dv, generator=g).to(DEV, dtype)
    radius = (0.5 + torch.rand(H, D, generator=g)).to(DEV)
    args = (q, k, v, radius, 4.0, None, None, True, 0.0, 0, 0.0)
    tables = torch.ops.fourierformer.fourier_attention_tables(q, k, radius)
    view = torch.empty(tables.numel() + 1, device=DEV)[1:]
    view.copy_(tables)
    assert view.data_ptr() % 16 != 0
    dout = torch.randn(B, H, N, Dv, generator=g).to(DEV, dtype)
    _assert_same(_ops_forward_backward(args, dout, tables), _ops_forward_backward(args, dout, view),
                 "a misaligned view of the tables")
    torch.cuda.synchronize()


def test_score_cache_beyond_the_former_fixed_budget(monkeypatch):
    """B H N M floats of 302 MiB (over the 256 MiB the score cache once had at most): the budget
    now comes from the free memory (score_cache.h), and the backward that keeps the scores gives
    what the one that computes them again gives (FOURIERFORMER_SCORE_CACHE_MB=0)."""
    g = torch.Generator().manual_seed(29)
    B, H, N, D = 1, 2, 6144, 16
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(DEV) * 0.5 for _ in range(3))
    radius = (0.5 + torch.rand(H, D, generator=g)).to(DEV)
    args = (q, k, v, radius, 4.0, None, None, True, 0.0, 0, 0.0)
    dout = torch.randn(B, H, N, D, generator=g).to(DEV)
    monkeypatch.delenv("FOURIERFORMER_SCORE_CACHE_MB", raising=False)
    cached = _ops_forward_backward(args, dout)
    monkeypatch.setenv("FOURIERFORMER_SCORE_CACHE_MB", "0")
    recomputed = _ops_forward_backward(args, dout)
    _assert_same(cached, recomputed, "score cache against recomputed scores")
