"""The published code's normaliser, out_i = sum_j w_ij v_j / (sum_j w_ij + eps), in every backend
and in the module and architectures (``normaliser_eps``, ``--fourier-normaliser-eps``,
``--fourier-published``).

The kernels against the float64 oracle (tests/oracle.py, which adds eps as one more key of value
0): the fuzz of tests/ops/test_op_fuzz.py draws eps on a third of its cases (at 0.1, 1 and 10 times the
median row's mass), with oracle_mismatches' bound; here the cases at the edges: rows whose keys
all underflow next to eps, fully masked rows, an eps that takes almost everything or almost
nothing, dropout, and the op's own checks. Tolerances: float32 results within oracle_mismatches'
bound (4 x a plain float32 implementation's error + (16 + p D) eps32 x the terms' scale, see
there); float64 within 1e-9 of the scale (float64_mismatches).
"""
from __future__ import annotations

import math

import pytest
import torch
from fairseq_helpers import parse_arch
from helpers import random_qkv
from oracle import float64_mismatches, oracle_attention, oracle_mismatches

from fourierformer_fairseq.ops import backend_unavailable_reason, fourier_attention
from fourierformer_fairseq.ops.reference import fourier_attention_reference

CPU_FUSED = not backend_unavailable_reason("cpu")
needs_cpu_kernel = pytest.mark.skipif(not CPU_FUSED, reason=f"fused CPU kernel: {backend_unavailable_reason('cpu')}")
BACKENDS = [pytest.param(b, d, id=f"{b}_{str(d)[6:]}") for b, d in [("reference", torch.float64), ("reference", torch.float32)] + (
    [("cpu", torch.float32), ("cpu", torch.float64)] if CPU_FUSED else [])]


def inputs(B=2, H=2, N=6, M=9, D=16, Dv=5, std=1.0, seed=0):
    """q, k (standard deviation std), v and the output gradient, float32."""
    return random_qkv(B, H, N, M, D, Dv, seed=seed, scale=std, grad_out=True)


def gradients(backend, dtype, q, k, v, radius, grad_out, **kwargs):
    leaves = [t.to(dtype).clone().requires_grad_() for t in (q, k, v, radius)]
    out = fourier_attention(*leaves, backend=backend, **kwargs)
    grads = torch.autograd.grad(out, leaves, grad_out.to(dtype), allow_unused=True)
    return (out.detach(), *[torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)])


def mismatches(ours, dtype, *args, **kwargs):
    if dtype == torch.float64:
        return float64_mismatches(ours, *args, **kwargs)
    return oracle_mismatches(ours, *args, **kwargs)


@pytest.mark.parametrize("backend,dtype", BACKENDS)
@pytest.mark.parametrize("eps", [1e-6, 1e-2, 1.0])
@pytest.mark.parametrize("causal", [False, True])
def test_every_backend_against_the_oracle(backend, dtype, eps, causal):
    q, k, v, grad_out = inputs(seed=int(eps * 1e6) % 97)
    radius = torch.tensor(2.0)
    kwargs = dict(power=4, causal=causal, normaliser_eps=eps)
    ours = gradients(backend, dtype, q, k, v, radius, grad_out, **kwargs)
    bad = mismatches(ours, dtype, q, k, v, radius, grad_out, **kwargs)
    assert not bad, "\n".join(bad)
    # the null key is there: the exact normalisation is far from it at these eps
    exact = oracle_attention(q, k, v, radius, power=4, causal=causal)
    assert (ours[0].double() - exact).abs().max() > 1e-3


@pytest.mark.parametrize("backend,dtype", BACKENDS)
def test_rows_whose_keys_all_underflow_give_zeros_and_zero_gradients(backend, dtype):
    # R 10 on std-3 features of dim 64: every sum_j w_ij is below e^-300, far below eps = 1e-6,
    # (the null key takes the whole row): out 0 and every gradient 0, all finite
    q, k, v, grad_out = inputs(N=4, M=7, D=64, std=3.0, seed=3)
    radius = torch.tensor(10.0)
    out, dq, dk, dv, dr = gradients(backend, dtype, q, k, v, radius, grad_out, power=4, normaliser_eps=1e-6)
    for t in (out, dq, dk, dv, dr):
        assert torch.isfinite(t).all()
        assert t.abs().max() == 0 if t is not out else t.abs().max() < 1e-30


@pytest.mark.parametrize("backend,dtype", BACKENDS)
def test_fully_masked_rows_stay_zero_and_other_rows_see_the_null_key(backend, dtype):
    q, k, v, grad_out = inputs(B=2, N=3, M=5, seed=5)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True  # the second sequence has no key
    radius = torch.tensor(0.5)
    kwargs = dict(power=2, key_padding_mask=kpm, normaliser_eps=0.5)
    ours = gradients(backend, dtype, q, k, v, radius, grad_out, **kwargs)
    assert (ours[0][1] == 0).all() and (ours[1][1] == 0).all()
    bad = mismatches(ours, dtype, q, k, v, radius, grad_out, **kwargs)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("backend,dtype", BACKENDS)
def test_a_huge_eps_takes_the_row_and_a_tiny_one_nothing(backend, dtype):
    q, k, v, grad_out = inputs(seed=8)
    radius = torch.tensor(1.0)
    exact = oracle_attention(q, k, v, radius, power=4)
    tiny = gradients(backend, dtype, q, k, v, radius, grad_out, power=4, normaliser_eps=1e-300)[0]
    huge = gradients(backend, dtype, q, k, v, radius, grad_out, power=4, normaliser_eps=1e30)[0]
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert (tiny.double() - exact).abs().max() < tol
    assert huge.abs().max() < 1e-25


@needs_cpu_kernel
def test_dropout_with_the_null_key_matches_the_reference():
    # the same counter-based dropout mask on both backends (seeded alike): the null key scales
    # the dropped-out weights as it scales the others
    q, k, v, grad_out = inputs(seed=11)
    radius = torch.tensor(1.5)
    outs = []
    for backend in ("reference", "cpu"):
        torch.manual_seed(7)
        outs.append(gradients(backend, torch.float64, q, k, v, radius, grad_out, power=4, dropout_p=0.3,
                              normaliser_eps=1e-2))
    for a, b in zip(*outs):
        assert (a - b).abs().max() <= 1e-10 * (1 + b.abs().max())


@needs_cpu_kernel
def test_need_weights_are_the_kernels_weights_with_the_null_key():
    q, k, v, _ = inputs(seed=12)
    radius = torch.tensor(2.0)
    out, P = fourier_attention(q, k, v, radius, power=4, normaliser_eps=1e-3, need_weights=True, backend="cpu")
    _, P_ref = fourier_attention_reference(q, k, v, radius, power=4, normaliser_eps=1e-3, need_weights=True)
    assert (P - P_ref).abs().max() < 1e-5
    assert (P.sum(-1) < 1 - 1e-3).any()  # rows that give part of their weight to the null key
    assert (out - P @ v).abs().max() < 1e-5


@needs_cpu_kernel
def test_opcheck_with_the_null_key():
    q, k, v, _ = inputs(B=1, H=2, N=4, M=5, D=3, Dv=2)
    for dtype in (torch.float32, torch.float64):
        r = torch.full((2, 3), 1.3, dtype=dtype, requires_grad=True)
        args = tuple(t.to(dtype).requires_grad_() for t in (q, k, v)) + (r, 4.0, None, None, True, 0.0, 0, 1e-2)
        torch.library.opcheck(torch.ops.fourierformer.fourier_attention_forward.default, args)


@pytest.mark.parametrize("eps", [-1e-6, float("inf"), float("nan")])
def test_bad_eps_is_refused_with_its_name(eps):
    q, k, v, _ = inputs(N=2, M=2, D=2, Dv=1)
    with pytest.raises(ValueError, match="normaliser_eps must be finite and >= 0"):
        fourier_attention(q, k, v, torch.tensor(1.0), normaliser_eps=eps)
    if CPU_FUSED:
        with pytest.raises(RuntimeError, match="normaliser_eps must be finite and >= 0"):
            torch.ops.fourierformer.fourier_attention_forward(q, k, v, torch.ones(2, 2), 4.0, None, None, False, 0.0,
                                                              0, eps)


# ----------------------------------------------------------------------------- the module


def test_module_with_the_null_key_runs_the_op_with_it_and_logs_its_share():
    from fairseq.logging import metrics

    from fourierformer_fairseq.modules import FourierMultiheadAttention

    torch.manual_seed(0)
    # q and k of std 0.8 (N(0, 0.1) projections of unit inputs, dim 64): paper-exact's scale at
    # fairseq's init, where the null key takes much of a row (at the published 0.02 it takes ~1e-7)
    kwargs = dict(power=4, qk_norm="none", radius_init=2.0, proj_init_std=0.1, bias=False, log_interval=1)
    m = FourierMultiheadAttention(64, 4, self_attention=True, normaliser_eps=1e-6, **kwargs)
    assert m.q_proj.bias is None and abs(m.q_proj.weight.std().item() - 0.1) < 0.01
    x = torch.randn(10, 2, 64)
    m.train()
    m.set_num_updates(1)
    with metrics.aggregate(new_root=True) as agg:
        out, _ = m(x, x, x, need_weights=False)
        share = dict(agg.get_smoothed_values())["nullkey_attn"]
    # the same weights without the null key: the outputs differ by the rows' shares
    m0 = FourierMultiheadAttention(64, 4, self_attention=True, normaliser_eps=0.0, **kwargs)
    m0.load_state_dict(m.state_dict())
    q = m.q_proj(x).view(10, 2, 4, 16).permute(1, 2, 0, 3)
    k = m.k_proj(x).view(10, 2, 4, 16).permute(1, 2, 0, 3)
    S = 4 * torch.log(torch.abs(torch.sinc(2.0 * (q.unsqueeze(3) - k.unsqueeze(2)).double() / math.pi))).sum(-1)
    expected = torch.sigmoid(math.log(1e-6) - torch.logsumexp(S[:1], -1)).mean().item()
    assert share == pytest.approx(expected, rel=1e-3, abs=1e-6) and share > 0.1
    m.eval()
    m0.eval()
    with torch.no_grad():
        a, _ = m(x, x, x, need_weights=False)
        b, _ = m0(x, x, x, need_weights=False)
    assert (a - b).abs().max() > 0.1 * b.abs().max()


@needs_cpu_kernel
def test_module_at_the_published_settings_against_the_oracle(monkeypatch):
    # The module built from --fourier-published's options (IWSLT's: p 2, a scalar radius of 1,
    # eps 1e-6, projections of std 0.02 without bias; 512 wide, 4 heads), where at init the null
    # key takes most of each row. The op's call is recorded: its keywords are the preset's, its
    # output and the gradients the module's backward sends through it (q, k, v and the radius)
    # are the float64 oracle's within oracle_mismatches' bound, the module's output is its
    # out_proj of the oracle's attention (float32 rounding), and the logged null-key share is
    # the op's own: 1 - sum_j P_ij of the weights the kernel returns (need_weights), averaged
    # over the first sequence's rows as the module logs it (rounded to 4 decimals).
    from fairseq.logging import metrics

    import fourierformer_fairseq.modules.fourier_multihead_attention as fmha
    from fourierformer_fairseq.models import FourierAttentionOptions
    from fourierformer_fairseq.models.attention_options import SITES
    from fourierformer_fairseq.modules import FourierMultiheadAttention

    options = dict(FourierAttentionOptions.from_args(parse_arch("fourierformer_iwslt_de_en", "--fourier-published"),
                                                     SITES).kwargs, log_interval=1)
    calls = []
    op = fmha.fourier_attention

    def recording(q, k, v, radius, **kw):
        out = op(q, k, v, radius, **kw)
        for t in (q, k, v, out):
            t.retain_grad()
        calls.append((q, k, v, kw, out))
        return out

    monkeypatch.setattr(fmha, "fourier_attention", recording)
    torch.manual_seed(0)
    E, Hh, N, B = 512, 4, 9, 2
    m = FourierMultiheadAttention(E, Hh, self_attention=True, **options)
    x = torch.randn(N, B, E)
    m.train()
    m.set_num_updates(1)
    with metrics.aggregate(new_root=True) as agg:
        out, _ = m(x, x, x, need_weights=False)
        share = dict(agg.get_smoothed_values())["nullkey_attn"]
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    (q, k, v, kw, o), = calls
    assert kw["power"] == 2 and kw["normaliser_eps"] == 1e-6 and kw["backend"] in ("auto", "cpu")
    radius = m.radius.detach()
    assert radius.numel() == 1 and radius.item() == 1.0
    ours = (o.detach(), q.grad, k.grad, v.grad, m.radius.grad.reshape(radius.shape))
    bad = oracle_mismatches(ours, q.detach(), k.detach(), v.detach(), radius, o.grad, power=2, normaliser_eps=1e-6)
    assert not bad, "\n".join(bad)
    exact = oracle_attention(q.detach(), k.detach(), v.detach(), radius, power=2, normaliser_eps=1e-6)
    with torch.no_grad():
        expected = m.out_proj(exact.float().permute(2, 0, 1, 3).reshape(N, B, E))
    torch.testing.assert_close(out.detach(), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    with torch.no_grad():
        _, P = op(q[:1], k[:1], v[:1], m.radius, power=2, normaliser_eps=1e-6, need_weights=True, backend="cpu")
    from_op = (1 - P.double().sum(-1)).mean().item()
    assert 0.1 < from_op < 0.99 and share == pytest.approx(from_op, abs=1e-4), (share, from_op)


@pytest.mark.parametrize("options,match", [
    (dict(normaliser_eps=-1.0), "normaliser_eps must be a finite number >= 0"),
    (dict(normaliser_eps=1e-6, kernel="gaussian"), "normaliser_eps is for the sinc kernel"),
    (dict(proj_init_std=0.0), "proj_init_std must be positive"),
])
def test_module_refuses_bad_options(options, match):
    from fourierformer_fairseq.modules import FourierMultiheadAttention

    with pytest.raises(ValueError, match=match):
        FourierMultiheadAttention(16, 2, self_attention=True, **options)


@pytest.mark.parametrize("arch,paper_r", [("fourierformer_iwslt_de_en", 1.0), ("fourierformer_lm_wiki103_small", 2.0)])
def test_the_published_preset_and_its_overrides(arch, paper_r):
    from fourierformer_fairseq.models import FourierAttentionOptions
    from fourierformer_fairseq.models.attention_options import LM_SITES, SITES

    sites = LM_SITES if "_lm_" in arch else SITES
    o = FourierAttentionOptions.from_args(parse_arch(arch, "--fourier-published"), sites)
    assert (o.qk_norm, o.radius_init, o.radius_shape, o.normaliser_eps, o.proj_init_std, o.bias) == (
        "none", paper_r, "scalar", 1e-6, 0.02, False)
    o = FourierAttentionOptions.from_args(
        parse_arch(arch, "--fourier-published", "--fourier-normaliser-eps", "1e-4", "--fourier-proj-bias"), sites)
    assert (o.normaliser_eps, o.bias, o.qk_norm) == (1e-4, True, "none")
    o = FourierAttentionOptions.from_args(parse_arch(arch, "--fourier-paper-exact", "--fourier-normaliser-eps", "1e-6"), sites)
    assert (o.normaliser_eps, o.qk_norm, o.radius_init) == (1e-6, "none", paper_r)
    assert "proj_init_std" not in o.kwargs and "bias" not in o.kwargs
    o = FourierAttentionOptions.from_args(parse_arch(arch), sites)
    assert "normaliser_eps" not in o.kwargs and o.qk_norm == "rms"
    with pytest.raises(ValueError, match="--fourier-normaliser-eps must be a finite number >= 0"):
        FourierAttentionOptions.from_args(parse_arch(arch, "--fourier-normaliser-eps", "-1"), sites)
