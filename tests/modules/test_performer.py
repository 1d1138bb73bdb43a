"""Performer (FAVOR+) attention: the estimator, causal prefix sums, padding, caching, redraws,
checkpoints, the architectures, and the experimental fourier_rf kernel. The contract it shares
with the other attention kinds (fairseq's MultiheadAttention interface, incremental decoding of a
model, beam search, reordering) is tested over every kind in tests/modules/test_attention_kinds.py.

Every test is seeded. Tolerances: float32 comparisons of two summation orders of the same
quantity use 1e-5 (a few hundred float32 ulps of O(1) values); statistical checks state the
standard error they are derived from.
"""
import hashlib
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from fairseq_helpers import (
    LM_DIMS,
    arch_task,
    build_model,
    eval_lm_main,
    parse_arch,
    run_cli,
    train_language_model,
    unigram_perplexity,
    USER_DIR,
)
from fourierformer_fairseq.modules import PerformerMultiheadAttention
from fourierformer_fairseq.ops import favor
from fourierformer_fairseq.ops.reference import fourier_attention_reference
from helpers import single_thread, split_heads
from repo import TESTS

E, H = 32, 2
D = E // H


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tests run many tiny operations, which extra threads only slow down on a busy machine."""
    with single_thread():
        yield


PERFORMER_TWINS = {
    "performer_iwslt_de_en": "transformer_iwslt_de_en",
    "performer_lm_wiki103_small": "softmax_lm_wiki103_small",
    "performer_lm_wiki103_medium": "softmax_lm_wiki103_medium",
}


def make(torch_seed=0, **kw):
    torch.manual_seed(torch_seed)
    kw.setdefault("num_features", 64)
    return PerformerMultiheadAttention(E, H, **kw).eval()


# ============================================================================ the module


def test_default_features_buffers_and_the_fourier_rf_radius():
    """Beyond the contract of every kind (tests/modules/test_attention_kinds.py: the stock parameter names):
    the default number of features, the feature buffers, and fourier_rf's learnable radius."""
    m = PerformerMultiheadAttention(E, H, self_attention=True)
    assert m.num_features == round(D * math.log(D)) == 44  # the default m = round(d ln d)
    stock = MultiheadAttention(E, H, self_attention=True)
    assert set(dict(m.named_buffers())) == {"projection", "feature_seed", "feature_draw"}
    assert m.projection.shape == (44, D) and m.projection.dtype == torch.float32
    rf = PerformerMultiheadAttention(E, H, self_attention=True, kernel="fourier_rf", radius_shape="head",
                                     radius_init=1.5)
    assert set(dict(rf.named_parameters())) == set(dict(stock.named_parameters())) | {"radius"}
    assert rf.radius.shape == (H, 1) and torch.all(rf.radius == 1.5)


def test_feature_draw_leaves_the_global_rng_alone():
    """The features come from generators of their own: building consumes the global RNG exactly as
    the stock module does, and redrawing or reseeding consumes none of it."""
    torch.manual_seed(5)
    MultiheadAttention(E, H, self_attention=True)
    after_stock = torch.randn(3)
    torch.manual_seed(5)
    m = PerformerMultiheadAttention(E, H, self_attention=True, redraw_interval=1).train()
    assert torch.equal(torch.randn(3), after_stock)
    torch.manual_seed(5)
    expected = torch.randn(3)
    torch.manual_seed(5)
    m.set_num_updates(7)
    m.redraw_features(draw=3, seed=11)
    favor.draw_projection("fourier_rf", 8, D, 3, power=4)
    assert torch.equal(torch.randn(3), expected)


def test_orthogonal_features_rows():
    """Rows orthogonal within each block of d, with chi-distributed norms (mean sqrt(2) Gamma((d+1)/2) / Gamma(d/2))."""
    w = favor.gaussian_orthogonal_matrix(2 * D, D, torch.Generator().manual_seed(0)).double()
    for block in (w[:D], w[D:]):
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        assert off.abs().max() < 1e-4 * gram.diagonal().max()
    norms = torch.cat([favor.gaussian_orthogonal_matrix(D, D, torch.Generator().manual_seed(s)).norm(dim=1)
                       for s in range(200)]).double()
    chi_mean = math.sqrt(2) * math.exp(math.lgamma((D + 1) / 2) - math.lgamma(D / 2))
    chi_sd = math.sqrt(D - chi_mean ** 2)
    # 3200 norms: the sample mean's standard error is chi_sd / sqrt(3200); allow 5 of them
    assert abs(norms.mean().item() - chi_mean) < 5 * chi_sd / math.sqrt(norms.numel())


@pytest.mark.parametrize("feature_type", ["iid", "orthogonal"])
def test_kernel_estimate_mse_follows_the_variance_formula(feature_type):
    """Positive random features estimate SM(x, y) = exp(x . y) with, for iid rows,
    MSE = SM(x, y)^2 (exp(|x + y|^2) - 1) / m (Choromanski et al. 2021, Lemma 2); orthogonal
    rows do no worse (their Theorem 2). 400 draws per m: the MSE estimate has a relative standard
    error of about sqrt(2 / 400) = 0.07 if the error is near normal; the bounds allow 4 of them."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(D, generator=g)
    y = torch.randn(D, generator=g)
    # scale so that |x' + y'|^2 = 0.5 with x' = x d^-1/4: a moderate variance, near-normal errors
    s = math.sqrt(0.5) / ((x + y) * D ** -0.25).norm().item()
    x, y = x * s, y * s
    xs, ys = x * D ** -0.25, y * D ** -0.25
    sm = math.exp((xs @ ys).item())
    theory_factor = sm ** 2 * (math.exp((xs + ys).square().sum().item()) - 1)
    ratios, mses = [], []
    for m in (16, 128):
        est = []
        for draw in range(400):
            w = favor.gaussian_orthogonal_matrix(m, D, torch.Generator().manual_seed(1000 * m + draw), feature_type)
            lx = favor.softmax_key_logits(x.view(1, 1, 1, D), w).double()
            ly = favor.softmax_key_logits(y.view(1, 1, 1, D), w).double()
            est.append(torch.exp(lx + ly).mean().item())
        mse = (torch.tensor(est, dtype=torch.float64) - sm).square().mean().item()
        mses.append(mse)
        ratios.append(mse / (theory_factor / m))
    for r in ratios:
        if feature_type == "iid":
            assert 0.72 < r < 1.28, ratios
        else:
            assert r < 1.28, ratios
    assert mses[1] < mses[0] / 4  # theory: 8 times smaller


def test_output_error_against_exact_softmax_shrinks_with_m():
    """Relative output error of FAVOR+ against exact softmax attention, mean over 8 draws, falls by
    about 2 for every 4 times more features (1 / sqrt(m)); we require 1.5. The inputs are small
    (|q' + k'|^2 about 1): the variance carries a factor exp(|q' + k'|^2), and with larger inputs
    the heavy tail of the features keeps m in the slower pre-asymptotic regime up to thousands."""
    g = torch.Generator().manual_seed(1)
    N = 64
    q = torch.randn(2, H, N, D, generator=g) * 0.35
    k = torch.randn(2, H, N, D, generator=g) * 0.35
    v = torch.randn(2, H, N, D, generator=g)
    exact = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) @ v
    errors = []
    for m in (16, 64, 256, 1024):
        err = 0.0
        for draw in range(8):
            w = favor.draw_projection("softmax", m, D, favor.feature_seed(draw, "t", m))
            out = favor.favor_attention(q, k, v, w)
            err += ((out - exact).norm() / exact.norm()).item() / 8
        errors.append(err)
    for a, b in zip(errors, errors[1:]):
        assert b < a / 1.5, errors


# ============================================================================ causal prefix sums


def test_causal_prefix_sums_gradcheck():
    """The custom backward (forward sweep for dq, reverse sweep for dk and dv) against finite differences."""
    g = torch.Generator().manual_seed(0)
    qf = torch.rand(1, 1, 9, 3, generator=g, dtype=torch.float64, requires_grad=True)
    kf = torch.rand(1, 1, 9, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 9, 2, generator=g, dtype=torch.float64, requires_grad=True)
    logscale = torch.cummax(2 * torch.randn(1, 1, 9, generator=g, dtype=torch.float64), -1).values
    # chunks of 4 over 9 positions: a full chunk, a full chunk carrying the prefix, a partial one
    fn = lambda a, b, c: favor.CausalLinearAttention.apply(a, b, c, logscale, 4)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (qf, kf, v))
    # and the value equals the quadratic masked form
    y = favor.CausalLinearAttention.apply(qf, kf, v, logscale, 4)
    decay = torch.exp(logscale.unsqueeze(-2) - logscale.unsqueeze(-1)).tril()
    torch.testing.assert_close(y, ((qf @ kf.transpose(-1, -2)) * decay) @ v, rtol=1e-12, atol=1e-12)


def saved_for_backward(fn):
    """numel of every tensor autograd saves while running fn()."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes


def test_causal_backward_keeps_no_position_by_feature_by_value_tensor():
    """What autograd keeps for the causal path is at most (batch, heads, positions, max(m, dv + 1)):
    the features and values, never the (positions, m, dv) prefix sums a cumulative sum would keep
    (the same hook sees them in that naive form)."""
    B, N, m, dv = 1, 64, 16, 16
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, N, D, generator=g, requires_grad=True)
    k = torch.randn(B, H, N, D, generator=g, requires_grad=True)
    v = torch.randn(B, H, N, dv, generator=g, requires_grad=True)
    w = favor.draw_projection("softmax", m, D, 1)
    sizes = saved_for_backward(lambda: favor.favor_attention(q, k, v, w, causal=True, chunk=16))
    assert max(sizes) <= B * H * N * max(m, D, dv + 1)

    def naive():
        qf = favor.softmax_query_features(q, w)
        kf = favor.softmax_query_features(k, w)
        prefix = torch.cumsum(kf.unsqueeze(-1) * v.unsqueeze(-2), dim=2)  # (B, H, N, m, dv)
        return (qf.unsqueeze(-1) * prefix).sum(-2)

    assert max(saved_for_backward(naive)) >= B * H * N * m * dv


@pytest.mark.parametrize("kernel", ["softmax", "relu", "fourier_rf"])
def test_causal_module_equals_quadratic_reference_from_the_same_features(kernel):
    """Module output and gradients equal a quadratic masked attention computed from the same
    features (chunks of 4 over 13 positions, so that the prefix state crosses chunks). In float64,
    where both are exact to rounding: 1e-9."""
    m = make(self_attention=True, causal=True, kernel=kernel, chunk_size=4, num_features=8 if kernel == "fourier_rf" else 64)
    m = m.double().train()
    T, B = 13, 2
    x = torch.randn(T, B, E, dtype=torch.float64) * 2
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    out, _ = m(x1, x1, x1, need_weights=False)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    q, k, v = (split_heads(proj(x2), H) for proj in (m.q_proj, m.k_proj, m.v_proj))
    assert m.projection.dtype == torch.float32  # kept float32 by .double() too
    projection = m.projection.double()
    qf = favor.query_features(kernel, q, projection, m.radius)
    kf, logscale = favor.key_features(kernel, k, projection, None, True, m.radius)
    a = (qf @ kf.transpose(-1, -2)) * torch.exp(logscale.unsqueeze(-2) - logscale.unsqueeze(-1)).tril()
    ref = (a / a.sum(-1, keepdim=True)) @ v
    ref = m.out_proj(ref.permute(2, 0, 1, 3).reshape(T, B, E))
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-9)
    for g1, p in zip(grads, m.parameters()):
        torch.testing.assert_close(g1, p.grad, rtol=1e-9, atol=1e-9)


def test_causal_stabiliser_never_looks_ahead_and_survives_large_keys():
    """Keys so large that every unstabilised float32 feature exp(w . k' - |k'|^2 / 2) underflows
    to 0 (0 / 0 attention); with the running-maximum stabiliser the output equals the float64
    unstabilised computation, and no output depends on later keys."""
    g = torch.Generator().manual_seed(3)
    N = 20
    w = favor.draw_projection("softmax", 32, D, 7)
    q = torch.randn(1, H, N, D, generator=g)
    k = torch.randn(1, H, N, D, generator=g) * 15
    v = torch.randn(1, H, N, 3, generator=g)
    assert torch.all(torch.exp(favor.softmax_key_logits(k, w)) == 0)
    out = favor.favor_attention(q, k, v, w, causal=True, chunk=6, eps=0.0)
    lq = favor.softmax_key_logits(q, w).double()  # query features up to a row constant
    lk = favor.softmax_key_logits(k.double(), w.double())
    shift = lq.amax(-1, keepdim=True).unsqueeze(-1) + lk.amax()  # one constant per query row: cancels
    a = torch.exp(lq.unsqueeze(-2) + lk.unsqueeze(-3) - shift).sum(-1).tril()
    ref = (a / a.sum(-1, keepdim=True)) @ v.double()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    # keys after position 9 three times larger: nothing up to 9 changes, bit for bit
    k2 = k.clone()
    k2[:, :, 10:] *= 3
    out2 = favor.favor_attention(q, k2, v, w, causal=True, chunk=6, eps=0.0)
    assert torch.equal(out2[:, :, :10], out[:, :, :10])
    assert not torch.allclose(out2[:, :, 10:], out[:, :, 10:])


# ============================================================================ padding


@pytest.mark.parametrize("kernel", ["softmax", "relu", "fourier_rf"])
@pytest.mark.parametrize("causal", [False, True])
def test_appending_padded_keys_changes_nothing(kernel, causal):
    m = make(self_attention=True, kernel=kernel, chunk_size=4, num_features=8 if kernel == "fourier_rf" else 64)
    T, extra, B = 7, 5, 2
    x = torch.randn(T, B, E)
    junk = torch.randn(extra, B, E) * 50  # padded positions with huge values: must not move any stabiliser
    xp = torch.cat([x, junk])
    kpm = torch.zeros(B, T + extra, dtype=torch.bool)
    kpm[:, T:] = True
    m.causal = causal
    out, w = m(x, x, x, need_head_weights=True)
    out_p, w_p = m(xp, xp, xp, key_padding_mask=kpm, need_head_weights=True)
    torch.testing.assert_close(out_p[:T], out, rtol=1e-5, atol=1e-6)
    assert torch.all(w_p[..., T:] == 0), "padded keys get exactly zero weight"
    torch.testing.assert_close(w_p[:, :, :T, :T], w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.sum(-1), torch.ones(H, B, T), rtol=1e-5, atol=1e-5)


def test_left_padding_in_causal_attention_and_padding_only_rows():
    """Leading padded positions (their features must not become inf * 0) change nothing for the real
    ones; a row that sees only padding gives 0, not NaN, and so do its gradients."""
    m = make(self_attention=True, causal=True, chunk_size=4).train()
    T, pad, B = 6, 5, 2
    x = torch.randn(T, B, E)
    xp = torch.cat([torch.randn(pad, B, E) * 50, x]).requires_grad_(True)
    kpm = torch.zeros(B, T + pad, dtype=torch.bool)
    kpm[:, :pad] = True
    out, _ = m(x, x, x, need_weights=False)
    out_p, _ = m(xp, xp, xp, key_padding_mask=kpm, need_weights=False)
    torch.testing.assert_close(out_p[pad:], out, rtol=1e-5, atol=1e-6)
    # the padded queries see only padded keys: attention 0, so their output is out_proj's bias
    torch.testing.assert_close(out_p[:pad], m.out_proj.bias.expand(pad, B, E), rtol=0, atol=0)
    out_p.square().sum().backward()
    assert torch.isfinite(xp.grad).all() and all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_cross_attention_padding_and_batch_equals_single():
    m = make(encoder_decoder_attention=True, kdim=12, vdim=12)
    lengths = [6, 4, 2]
    enc = torch.randn(6, 3, 12)
    kpm = torch.arange(6).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)
    q = torch.randn(5, 3, E)
    out, _ = m(q, enc, enc, key_padding_mask=kpm)
    for b, n in enumerate(lengths):
        single, _ = m(q[:, b:b + 1], enc[:n, b:b + 1], enc[:n, b:b + 1])
        torch.testing.assert_close(out[:, b:b + 1], single, rtol=1e-5, atol=1e-6)


# ============================================================================ incremental decoding


@pytest.mark.parametrize("kernel", ["softmax", "relu", "fourier_rf"])
def test_incremental_decoding_equals_full_with_a_constant_size_cache(kernel):
    """In float64 (both orders of summation exact to rounding: 1e-10); float32 is checked on the LM below."""
    m = make(self_attention=True, causal=True, kernel=kernel, chunk_size=4, num_features=8 if kernel == "fourier_rf" else 64)
    m = m.double()
    T, B = 11, 3
    x = torch.randn(T, B, E, dtype=torch.float64) * 2
    full, _ = m(x, x, x, need_weights=False)
    state = {}
    steps, shapes = [], []
    for t in range(T):
        out, w = m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state)
        assert w is None
        steps.append(out)
        shapes.append({k: tuple(v.shape) for k, v in m._get_input_buffer(state).items()})
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-10, atol=1e-10)
    assert all(s == shapes[0] for s in shapes), "the cache does not grow with the prefix"
    F = m.projection.size(0) if kernel != "fourier_rf" else 8 * 17
    assert shapes[0] == {"prefix_kv": (B, H, F, D + 1), "prefix_logscale": (B, H)}
    # several positions per call continue the same prefix
    state2 = {}
    a, _ = m(x[:4], x[:4], x[:4], incremental_state=state2)
    b, _ = m(x[4:], x[4:], x[4:], incremental_state=state2)
    torch.testing.assert_close(torch.cat([a, b]), full, rtol=1e-10, atol=1e-10)


def test_static_kv_cache_and_beamable_cross_attention():
    beam = 3
    plain = make(encoder_decoder_attention=True)
    beamable = make(encoder_decoder_attention=True)
    beamable.load_state_dict(plain.state_dict())
    beamable.set_beam_size(beam)
    enc = torch.randn(5, 2, E).repeat_interleave(beam, dim=1)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2]).repeat_interleave(beam, dim=0)
    q = torch.randn(2, 2 * beam, E)
    full, full_w = plain(q, enc, enc, key_padding_mask=kpm, need_head_weights=True)
    s1, s2 = {}, {}
    for t in range(2):
        a, aw = plain(q[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=s1, static_kv=True,
                      need_head_weights=True)
        b, bw = beamable(q[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=s2, static_kv=True,
                         need_head_weights=True)
        torch.testing.assert_close(a, full[t:t + 1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bw, aw, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(aw, full_w[:, :, t:t + 1], rtol=1e-5, atol=1e-6)
    assert beamable._get_input_buffer(s2)["prev_key"].size(0) == 2
    new_order = torch.tensor([2, 0, 1, 5, 5, 3])
    plain.reorder_incremental_state(s1, new_order)
    beamable.reorder_incremental_state(s2, new_order)
    q2 = torch.randn(1, 2 * beam, E)
    a, _ = plain(q2, None, None, incremental_state=s1, static_kv=True)
    b, _ = beamable(q2, None, None, incremental_state=s2, static_kv=True)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ============================================================================ redraws and checkpoints


# a fresh process draws the features with nothing but torch imported (ops/favor.py loaded from its file)
DRAW_SCRIPT = textwrap.dedent("""
    import hashlib, importlib.util, sys
    import torch
    spec = importlib.util.spec_from_file_location("favor", {path!r})
    favor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(favor)
    torch.manual_seed(int(sys.argv[1]))  # a different global RNG in each process: the features must not care
    h = hashlib.sha256()
    for kernel in ("softmax", "fourier_rf"):
        for draw in (0, 3):
            seed = favor.feature_seed(favor.feature_seed(7, "decoder.layers.1.self_attn"), "", draw)
            h.update(favor.draw_projection(kernel, 44, 16, seed, power=4).numpy().tobytes())
    print(h.hexdigest())
""")

MODEL_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import torch
    sys.path.insert(0, {tests!r})
    from fairseq_helpers import LM_DIMS, build_model
    torch.manual_seed(int(sys.argv[1]))
    model, _ = build_model("performer_lm_wiki103_small", dims=LM_DIMS, task="language_modeling",
                           extra=["--performer-redraw-interval", "3", "--seed", "7"])
    model.train()
    model.set_num_updates(10)  # draw 10 // 3 = 3
    h = hashlib.sha256()
    for name, buf in sorted(model.named_buffers()):
        if name.endswith("projection"):
            h.update(name.encode()); h.update(buf.numpy().tobytes())
    print(h.hexdigest())
""")


def projection_digest(model):
    h = hashlib.sha256()
    for name, buf in sorted(model.named_buffers()):
        if name.endswith("projection"):
            h.update(name.encode())
            h.update(buf.numpy().tobytes())
    return h.hexdigest()


def run_in_two_processes(script):
    """stdout's last word of ``script`` run in two fresh processes (global seeds 1 and 2), concurrently."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for s in (1, 2)]
    digests = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        digests.append(out.split()[-1])
    return digests


def test_feature_draws_are_identical_across_processes():
    digests = run_in_two_processes(DRAW_SCRIPT.format(path=favor.__file__))
    h = hashlib.sha256()
    for kernel in ("softmax", "fourier_rf"):
        for draw in (0, 3):
            seed = favor.feature_seed(favor.feature_seed(7, "decoder.layers.1.self_attn"), "", draw)
            h.update(favor.draw_projection(kernel, 44, 16, seed, power=4).numpy().tobytes())
    assert digests[0] == digests[1] == h.hexdigest()


def build_redraw_model():
    return build_model("performer_lm_wiki103_small", dims=LM_DIMS, task="language_modeling",
                       extra=["--performer-redraw-interval", "3", "--seed", "7"])[0]


def test_redraws_follow_seed_name_and_update_and_happen_only_in_training():
    torch.manual_seed(3)
    model = build_redraw_model()
    initial = projection_digest(model)
    model.eval()
    model.set_num_updates(10)
    assert projection_digest(model) == initial, "no redraw in evaluation"
    model.train()
    model.set_num_updates(10)
    assert projection_digest(model) != initial
    layers = {n: m for n, m in model.named_modules() if isinstance(m, PerformerMultiheadAttention)}
    assert list(layers) == ["decoder.layers.0.self_attn", "decoder.layers.1.self_attn"]
    for name, m in layers.items():
        # draw 10 // 3 = 3 of the seed hash(--seed, module name): what any process computes (test above)
        assert int(m.feature_draw) == 3
        expected = favor.draw_projection("softmax", m.num_features, m.head_dim,
                                         favor.feature_seed(favor.feature_seed(7, name), "", 3))
        assert torch.equal(m.projection, expected)
    a, b = layers.values()
    assert not torch.equal(a.projection, b.projection), "each layer draws its own features"
    after = projection_digest(model)
    model.set_num_updates(11)  # same interval: no redraw
    assert projection_digest(model) == after
    torch.manual_seed(4)  # another global seed builds the same features
    other = build_redraw_model().train()
    other.set_num_updates(10)
    assert projection_digest(other) == after


def test_model_redraw_is_identical_in_two_fresh_processes():
    digests = run_in_two_processes(MODEL_SCRIPT.format(tests=TESTS))
    model = build_redraw_model().train()
    model.set_num_updates(10)
    assert digests[0] == digests[1] == projection_digest(model)


def test_checkpoint_round_trip_keeps_the_features(tmp_path):
    m = make(self_attention=True, redraw_interval=2, seed=4).train()
    m.set_num_updates(9)
    path = tmp_path / "state.pt"
    torch.save(m.state_dict(), path)
    other = make(self_attention=True, redraw_interval=2, seed=99)
    assert not torch.equal(other.projection, m.projection)
    other.load_state_dict(torch.load(path, weights_only=True))
    assert torch.equal(other.projection, m.projection)
    assert int(other.feature_draw) == 4 and int(other.feature_seed) == 4
    x = torch.randn(5, 2, E)
    torch.testing.assert_close(other.eval()(x, x, x)[0], m.eval()(x, x, x)[0], rtol=0, atol=0)
    # continuing training from the checkpoint redraws exactly what the original module would have
    other.train().set_num_updates(10)
    m.train().set_num_updates(10)
    assert torch.equal(other.projection, m.projection)
    # fp16 models keep float32 features (and load fp16 ones as float32)
    half = make(self_attention=True).half()
    assert half.projection.dtype == torch.float32 and half.q_proj.weight.dtype == torch.float16


def test_bfloat16_autocast_computes_features_in_float32():
    m = make(self_attention=True, causal=True)
    x = torch.randn(9, 2, E)
    ref, _ = m(x, x, x, need_weights=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = m(x, x, x, need_weights=False)
    assert torch.isfinite(out).all()
    # bfloat16 keeps 8 bits: the projections in and out carry ~2^-8 relative error each
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2 ** -5


# ============================================================================ architectures


@pytest.mark.parametrize("arch", sorted(PERFORMER_TWINS))
def test_arch_has_its_twins_shape_and_initialises_identically(arch):
    dims, task = arch_task(arch)
    ours, twin = vars(parse_arch(arch)), vars(parse_arch(PERFORMER_TWINS[arch]))
    for key, value in twin.items():
        if key not in ("arch", "_name"):
            assert ours.get(key) == value, f"{arch} and {PERFORMER_TWINS[arch]} differ in {key}"
    assert ours["performer_kernel"] == "softmax" and ours["performer_redraw_interval"] == 1000
    torch.manual_seed(3)
    model, _ = build_model(arch, dims=dims, task=task)
    torch.manual_seed(3)
    softmax, _ = build_model(PERFORMER_TWINS[arch], dims=dims, task=task)
    pp, sp = dict(model.named_parameters()), dict(softmax.named_parameters())
    assert set(pp) == set(sp)
    for name, p in sp.items():
        assert torch.equal(pp[name], p), name
    performer = [m for m in model.modules() if isinstance(m, PerformerMultiheadAttention)]
    stock = [m for m in softmax.modules() if isinstance(m, MultiheadAttention)]
    assert len(performer) == len(stock) > 0


def test_arch_options_reach_the_modules_and_errors_name_the_flags():
    model, _ = build_model("performer_iwslt_de_en", extra=[
        "--performer-attention", "encoder,cross", "--performer-kernel", "fourier_rf", "--performer-features", "6",
        "--fourier-radius-shape", "feature", "--performer-redraw-interval", "0"])
    kinds = {n: type(m).__name__ for n, m in model.named_modules() if isinstance(m, MultiheadAttention)}
    performer = "PerformerMultiheadAttention"
    assert kinds["encoder.layers.0.self_attn"] == kinds["decoder.layers.1.encoder_attn"] == performer
    assert kinds["decoder.layers.0.self_attn"] == "MultiheadAttention"
    attn = model.encoder.layers[0].self_attn
    assert (attn.kernel, attn.num_features, attn.power, attn.redraw_interval) == ("fourier_rf", 6, 2, 0)
    assert attn.radius.shape == (2, 8) and torch.all(attn.radius == 1.0)
    lm, _ = build_model("performer_lm_wiki103_small", dims=LM_DIMS, task="language_modeling",
                        extra=["--performer-kernel", "relu", "--performer-feature-type", "iid"])
    attn = lm.decoder.layers[0].self_attn
    assert (attn.kernel, attn.feature_type, attn.num_features) == ("relu", "iid", round(8 * math.log(8)))
    with pytest.raises(ValueError, match="even --fourier-power"):
        build_model("performer_lm_wiki103_small", dims=LM_DIMS, task="language_modeling",
                    extra=["--performer-kernel", "fourier_rf", "--fourier-power", "3"])
    with pytest.raises(ValueError, match="--performer-attention"):
        build_model("performer_lm_wiki103_small", dims=LM_DIMS, task="language_modeling",
                    extra=["--performer-attention", "cross"])


def test_masks_and_options_it_cannot_honour_raise():
    m = make(self_attention=True)
    x = torch.randn(4, 1, E)
    with pytest.raises(ValueError, match="attn_mask"):
        m(x, x, x, attn_mask=torch.zeros(4, 4))
    with pytest.raises(ValueError, match="before_softmax"):
        m(x, x, x, before_softmax=True)
    with pytest.raises(ValueError, match="add_bias_kv"):
        PerformerMultiheadAttention(E, H, add_bias_kv=True)
    with pytest.raises(ValueError, match="even power"):
        PerformerMultiheadAttention(E, H, kernel="fourier_rf", power=3)
    with pytest.raises(ValueError, match="kernel must be one of"):
        PerformerMultiheadAttention(E, H, kernel="cosine")


# ============================================================================ fourier_rf


def test_fourier_rf_frequencies_estimate_the_square_root_kernel_without_bias():
    """mean_r cos(w_r . t) estimates h(t) = prod_d sinc^(p/2)(t_d) without bias: over 400 iid
    draws of m = 16 its mean is within 5 standard errors (each cos has variance <= 1)."""
    t = torch.tensor([0.5, -0.9, 0.2, 1.2], dtype=torch.float64)
    for power in (2, 4):
        h = torch.prod(torch.sinc(t / math.pi) ** (power // 2)).item()  # torch.sinc is sin(pi x) / (pi x)
        est = [torch.cos(favor.fourier_rf_frequencies(16, 4, power, s, "iid").double() @ t).mean().item()
               for s in range(400)]
        assert abs(sum(est) / len(est) - h) < 5 / math.sqrt(16 * 400)
        # the scrambled Sobol frequencies are unbiased too and, for this smooth integrand, more accurate
        qmc = torch.tensor([torch.cos(favor.fourier_rf_frequencies(16, 4, power, s, "qmc").double() @ t).mean().item()
                            for s in range(400)])
        assert abs(qmc.mean().item() - h) < 5 / math.sqrt(16 * 400)
        iid_rmse = (torch.tensor(est) - h).square().mean().sqrt()
        assert (qmc - h).square().mean().sqrt() < iid_rmse / 1.3


def test_fourier_rf_features_are_a_non_negative_square():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, 6, D, generator=g)
    k = torch.randn(1, H, 9, D, generator=g)
    w = favor.fourier_rf_frequencies(8, D, 4, 1)
    radius = torch.tensor(0.8)
    gq, gk = favor.fourier_rf_features(q, w, radius), favor.fourier_rf_features(k, w, radius)
    assert gq.shape[-1] == 8 * 17
    f = lambda x: torch.cat([torch.cos(0.8 * x @ w.T), torch.sin(0.8 * x @ w.T)], -1) / math.sqrt(8)  # noqa: E731
    torch.testing.assert_close(gq @ gk.transpose(-1, -2), (f(q) @ f(k).transpose(-1, -2)).square(),
                               rtol=1e-5, atol=1e-7)
    assert torch.all(gq @ gk.transpose(-1, -2) >= -1e-7)


def test_fourier_rf_attention_approaches_the_fourier_op_and_learns_the_radius():
    """At a scale where the kernel is not degenerate (q, k ~ N(0, 0.25), R = 1, p = 2, d = 4) the
    output error against the exact Fourier op, mean over 6 seeds, falls as m grows."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 32, 4, generator=g) * 0.5
    k = torch.randn(1, 2, 32, 4, generator=g) * 0.5
    v = torch.randn(1, 2, 32, 4, generator=g)
    radius = torch.tensor(1.0)
    exact = fourier_attention_reference(q, k, v, radius, power=2)
    errors = []
    for m in (4, 16, 64):
        err = 0.0
        for s in range(6):
            w = favor.fourier_rf_frequencies(m, 4, 2, s)
            out = favor.favor_attention(q, k, v, w, kernel="fourier_rf", radius=radius)
            err += ((out - exact).norm() / exact.norm()).item() / 6
        errors.append(err)
    assert errors[1] < errors[0] / 1.5 and errors[2] < errors[1] / 1.5, errors
    m = make(self_attention=True, causal=True, kernel="fourier_rf", num_features=8, radius_shape="head").train()
    x = torch.randn(6, 2, E)
    out, _ = m(x, x, x, need_weights=False)
    out.square().sum().backward()
    # against central differences of the same loss, in float64 with the same features
    m64, x64 = m.double(), x.double()
    grad = m64.radius.grad.clone()
    eps = 1e-6
    for h in range(grad.numel()):
        losses = []
        for sign in (1, -1):
            with torch.no_grad():
                m64.radius.view(-1)[h] += sign * eps
                losses.append(m64(x64, x64, x64, need_weights=False)[0].square().sum())
                m64.radius.view(-1)[h] -= sign * eps
        fd = (losses[0] - losses[1]) / (2 * eps)
        assert abs(grad.view(-1)[h].item() - fd.item()) <= 1e-3 * abs(fd.item()) + 1e-6, (h, grad, fd)
    assert grad.abs().min() > 0


# ============================================================================ end to end


def test_performer_lm_trains_with_redraws_and_evaluates(lm_data, tmp_path):
    """fairseq-train (30 updates of 128 tokens on the learnable Markov data, features redrawn every
    4 updates), then fairseq-eval-lm: the model must score under half the unigram perplexity (which
    no model ignoring its context reaches), and the checkpoint holds draw num_updates // 4 of each
    layer's seed."""
    save_dir = str(tmp_path)
    train_language_model(lm_data, save_dir, "performer_lm_wiki103_small",
                         ["--max-tokens", "128", "--max-update", "30", "--performer-redraw-interval", "4"],
                         max_epoch=100)
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    state = torch.load(checkpoint)
    updates = state["optimizer_history"][-1]["num_updates"]
    assert updates == 30
    projections = {k: v for k, v in state["model"].items() if k.endswith(".projection")}
    assert len(projections) == 2
    for key, proj in projections.items():
        prefix = key[: -len("projection")]
        seed, draw = int(state["model"][prefix + "feature_seed"]), int(state["model"][prefix + "feature_draw"])
        assert draw == updates // 4
        assert torch.equal(proj, favor.draw_projection("softmax", proj.size(0), proj.size(1),
                                                       favor.feature_seed(seed, "", draw)))
    threshold = unigram_perplexity(os.path.join(lm_data, "train.out"), os.path.join(lm_data, "valid.out")) / 2
    result = eval_lm_main(lm_data, checkpoint)
    assert float(result["perplexity"]) < threshold, (result, threshold)
    # a fresh stock fairseq-eval-lm rebuilds the model from the saved config and scores the same
    proc = run_cli("fairseq-eval-lm", [lm_data, "--user-dir", USER_DIR, "--path", checkpoint,
                                       "--tokens-per-sample", "32", "--max-tokens", "500",
                                       "--required-batch-size-multiple", "1"])
    fresh = re.search(r"Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+)", proc.stdout + proc.stderr)
    assert fresh, proc.stderr[-2000:]
    # (printed with two decimals: within half a unit of the last digit)
    assert abs(float(fresh.group(2)) - float(result["perplexity"])) <= 0.0051, (fresh.group(0), result)
    print(f"performer LM: perplexity {float(result['perplexity']):.4f} (fresh process {fresh.group(2)}), "
          f"half the unigram perplexity {threshold:.4f}")


def test_approximation_script_prints_its_table(capsys, monkeypatch):
    """scripts/analysis/dynamics/performer_approximation.py at the LM shape, one draw: a row per estimator and m;
    fourier_rf never has a non-positive normaliser; FAVOR+'s error falls from m = 16 to 1024."""
    import runpy

    from repo import script as tool

    script = tool("scripts/analysis/dynamics/performer_approximation.py")
    monkeypatch.setattr(sys, "argv", [script, "--draws", "1", "--shapes", "lm"])
    runpy.run_path(script, run_name="__main__")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| lm")]
    assert len(rows) == 2 + 4 * 4 + 2 + 3 * 4
    rf = [r for r in rows if r[2].startswith("fourier_rf")]
    assert len(rf) == 8 and all(r[6] == "0.0%" and r[8] == "0.0%" for r in rf)
    favor_rows = {int(r[3]): float(r[5].split()[0]) for r in rows if r[2] == "positive, orthogonal (FAVOR+)"}
    assert favor_rows[1024] < favor_rows[16]
