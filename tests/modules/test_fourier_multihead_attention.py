"""FourierMultiheadAttention: caching, masking, radius, dropout, errors. The contract it shares with
the other attention kinds (fairseq's MultiheadAttention interface, incremental decoding, beam
search, reordering) is tested over every kind in tests/modules/test_attention_kinds.py.

Values are checked against an independent float64 computation: the module's own parameters
applied with ``torch.nn.functional.linear`` in float64, and ``tests/oracle.py`` (written from
the formula, importing nothing from the package) for the attention. Tolerance rule: the
module's error against that float64 computation is at most twice the error of the same
computation run plainly in float32 (``oracle.plain_attention``), plus a stated absolute slack
(``helpers.check_against_plain``).
"""
import math

import pytest
import torch
import torch.nn.functional as F

from fourierformer_fairseq.modules import FourierMultiheadAttention
from fourierformer_fairseq.ops import DECLARATIONS, fourier_attention
from helpers import check_against_plain, future_mask, max_abs_error, split_heads
from oracle import oracle_attention, oracle_weights, plain_attention, plain_weights

E, H = 16, 4
D = E // H


def make(**kw):
    torch.manual_seed(0)
    kw.setdefault("power", 2)
    kw.setdefault("radius_init", 0.7)
    return FourierMultiheadAttention(E, H, **kw).eval()


def independent_forward(m, x, attention, dtype, radius=None, source=None, **kwargs):
    """out_proj(attention(q, k, v)) from m's parameters, recomputed in ``dtype`` without the module.

    Self-attention on x, or encoder-decoder attention from x to ``source``. When the module
    normalises q and k (``qk_norm="rms"``), they are divided by their RMS over the head dim
    here too. ``attention(q, k, v, radius, power=..., **kwargs)`` returns (B, H, T, D) or
    (out, extra); ``radius`` defaults to the module's. Returns (out (T, B, E), extra or None).
    """
    P = {n: p.detach().to(dtype) for n, p in m.named_parameters()}

    def proj(name, t):
        return F.linear(t.to(dtype), P[name + ".weight"], P[name + ".bias"])

    src = x if source is None else source
    q, k, v = (split_heads(proj(name, t), H) for name, t in (("q_proj", x), ("k_proj", src), ("v_proj", src)))
    if getattr(m, "qk_norm", "none") == "rms":
        q, k = (t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) for t in (q, k))
    r = P["radius"] if radius is None else radius
    result = attention(q, k, v, r, power=m.power, **kwargs)
    out, extra = result if isinstance(result, tuple) else (result, None)
    T, B = x.shape[:2]
    return proj("out_proj", out.permute(2, 0, 1, 3).reshape(T, B, E)), extra


def oracle_with_weights(q, k, v, radius, **kw):
    return oracle_attention(q, k, v, radius, **kw), oracle_weights(q, k, radius, **kw)


def plain_with_weights(q, k, v, radius, power, key_padding_mask=None):
    return (plain_attention(q, k, v, radius, power=power, key_padding_mask=key_padding_mask),
            plain_weights(q, k, radius, power=power, key_padding_mask=key_padding_mask))


@pytest.mark.parametrize("radius_shape", ["scalar", "head", "feature"])
def test_output_and_weights_match_the_float64_oracle(radius_shape):
    """Only scoring/normalisation change: out = out_proj(fourier_attention(q_proj x, k_proj x, v_proj x)).

    The module's output and its returned weights (the fused kernel computes both; the weights,
    asked for with need_head_weights, by running it again with the identity as values) against the
    float64 oracle; and the returned weights times the values give the module's output."""
    m = make(self_attention=True, radius_shape=radius_shape)
    with torch.no_grad():
        m.radius.copy_(torch.rand(m.radius.shape, generator=torch.Generator().manual_seed(1)) + 0.5)
    x = torch.randn(5, 3, E, generator=torch.Generator().manual_seed(2))
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    with torch.no_grad():
        out, w = m(x, x, x, key_padding_mask=kpm, need_head_weights=True)
        exact, exact_w = independent_forward(m, x, oracle_with_weights, torch.float64, key_padding_mask=kpm)
        plain, plain_w = independent_forward(m, x, plain_with_weights, torch.float32, key_padding_mask=kpm)
    exact_w, plain_w = exact_w.transpose(0, 1), plain_w.transpose(0, 1)  # (heads, batch, tgt, src), as returned
    # outputs and weights are O(1): 1e-6 absolute slack on top of the plain float32 error
    check_against_plain(out, plain, exact, f"output ({radius_shape} radius)", atol=1e-6)
    check_against_plain(w, plain_w, exact_w, f"weights ({radius_shape} radius)", atol=1e-6)
    assert torch.all(w[:, 1, :, 3:] == 0) and torch.all(w[:, 2, :, 4:] == 0), "padded keys get exactly zero weight"
    # the returned weights are the ones the output was computed with
    v = split_heads(F.linear(x.double(), m.v_proj.weight.double(), m.v_proj.bias.double()), H)
    heads = torch.matmul(w.transpose(0, 1).double(), v).permute(2, 0, 1, 3).reshape(5, 3, E)
    from_weights = F.linear(heads, m.out_proj.weight.double(), m.out_proj.bias.double())
    assert max_abs_error(out, from_weights) <= 2 * max_abs_error(plain, exact) + 1e-5


def test_padded_keys_get_zero_weight_and_batch_equals_single_sentences():
    m = make(self_attention=True)
    lengths = [6, 4, 2]
    T, B = max(lengths), len(lengths)
    x = torch.randn(T, B, E)
    kpm = torch.arange(T).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)  # right padding
    out, w = m(x, x, x, key_padding_mask=kpm, need_head_weights=True)
    for b, n in enumerate(lengths):
        assert torch.all(w[:, b, :, n:] == 0), "padded keys must get exactly zero weight"
        torch.testing.assert_close(w[:, b, :, :n].sum(-1), torch.ones(H, T))
        single, single_w = m(x[:n, b:b + 1], x[:n, b:b + 1], x[:n, b:b + 1], need_head_weights=True)
        torch.testing.assert_close(out[:n, b:b + 1], single, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w[:, b:b + 1, :n, :n], single_w, rtol=1e-5, atol=1e-6)


def test_causal_module_runs_causal_and_equals_the_future_masked_path(monkeypatch):
    """A module built with causal=True (as the decoder layer builds its self-attention) runs
    causal=True and reads no mask; a plain module given fairseq's future mask applies it as a mask.
    Both give the same outputs and gradients, for a float -inf and a bool future mask."""
    import fourierformer_fairseq.modules.fourier_multihead_attention as fmha

    calls = []
    real_attention = fmha.fourier_attention

    def spy(*args, **kw):
        calls.append((kw["attn_mask"], kw["causal"]))
        return real_attention(*args, **kw)

    monkeypatch.setattr(fmha, "fourier_attention", spy)
    causal = make(self_attention=True, causal=True).train()
    masked = make(self_attention=True).train()
    masked.load_state_dict(causal.state_dict())
    T = 7
    future = future_mask(T)
    x = torch.randn(T, 3, E, requires_grad=True)
    for mask in (future, torch.isinf(future)):
        outs, grads = [], []
        for mod, given in ((causal, None), (masked, mask)):
            calls.clear()
            mod.zero_grad()
            x.grad = None
            out, _ = mod(x, x, x, attn_mask=given, need_weights=False)
            out.square().sum().backward()
            outs.append(out)
            grads.append((x.grad.clone(), mod.radius.grad.clone()))
            got_mask, got_causal = calls[-1]
            if mod is causal:
                assert got_causal and got_mask is None
            else:
                assert not got_causal and got_mask is mask
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-4, atol=1e-5)
    # the first query sees only the first key
    _, w = causal.eval()(x, x, x, need_head_weights=True)
    assert torch.all(w[:, :, 0, 1:] == 0)


def test_a_causal_module_applies_a_given_mask_as_a_mask():
    """causal=True is said, not recognised: a mask given to a causal module is applied on top of
    causality (a future mask then changes nothing), to a plain module as given, never read as causal."""
    causal = make(self_attention=True, causal=True)
    plain = make(self_attention=True)
    T = 6
    x = torch.randn(T, 2, E)
    future = future_mask(T)
    g = torch.Generator().manual_seed(3)
    extra = torch.randn(T, T, generator=g)
    a, _ = causal(x, x, x, attn_mask=extra)
    b, _ = plain(x, x, x, attn_mask=extra + future)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(causal(x, x, x, attn_mask=future)[0], causal(x, x, x)[0], rtol=1e-5, atol=1e-6)
    # a plain module given the future mask is causal only through the mask: not the same as no mask
    assert not torch.allclose(plain(x, x, x, attn_mask=future)[0], plain(x, x, x)[0])


@pytest.mark.parametrize("phi", ["power", "sigmoid"])
@pytest.mark.parametrize("causal_flag", [False, True])
@pytest.mark.parametrize("add_zero_attn", [False, True])
def test_incremental_self_attention_equals_full(add_zero_attn, causal_flag, phi):
    """The steps equal the full causal forward: of a causal module, or of a plain one given the future
    mask; also for phi = sigmoid, whose steps of one query take the row groups and read the key table's
    keys as the cached keys' view."""
    m = make(self_attention=True, add_zero_attn=add_zero_attn, causal=causal_flag, phi=phi)
    T = 6
    x = torch.randn(T, 2, E)
    future = future_mask(T)
    full, _ = m(x, x, x, attn_mask=None if causal_flag else future)
    state = {}
    steps = [m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state)[0] for t in range(T)]
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-5, atol=1e-5)
    cached = m._get_input_buffer(state)
    assert cached["prev_key"].shape == (2, H, T, D), "the cache keeps fairseq's (batch, heads, seq, head_dim) layout"


def test_static_kv_cache_and_reorder():
    """Encoder-decoder attention caches the projected encoder keys once; reordering follows new_order."""
    m = make(encoder_decoder_attention=True)
    enc = torch.randn(5, 3, E)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    q = torch.randn(4, 3, E)
    full, full_w = m(q, enc, enc, key_padding_mask=kpm)
    state = {}
    outs = []
    for t in range(4):
        out, _ = m(q[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=state, static_kv=True)
        outs.append(out)
        if t == 0:  # after the first step the keys come from the cache, even without the encoder output
            cached_key = m._get_input_buffer(state)["prev_key"].clone()
    torch.testing.assert_close(torch.cat(outs), full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m._get_input_buffer(state)["prev_key"], cached_key)
    out, _ = m(q[:1], None, None, incremental_state=state, static_kv=True)
    torch.testing.assert_close(out, full[:1], rtol=1e-5, atol=1e-6)
    # beam search shrinks the batch as sentences finish (stock skips reordering a same-size enc-dec cache)
    new_order = torch.tensor([2, 0])
    m.reorder_incremental_state(state, new_order)
    out, _ = m(q[:1, new_order], None, None, incremental_state=state, static_kv=True)
    torch.testing.assert_close(out, full[:1, new_order], rtol=1e-5, atol=1e-6)


def assert_table_holds_the_cached_keys(m, state):
    """The layer's key table in the incremental state holds its cached keys exactly, at their positions."""
    buf = m._get_input_buffer(state)
    keys, table = buf["prev_key"], buf["prev_key_table"]
    M = keys.size(2)
    assert table.size(-1) >= M and table.size(-1) % DECLARATIONS["cpu"].key_table_keys == 0
    assert torch.equal(table[..., :M], keys.transpose(2, 3)), "the key table is not the cached keys"
    if m.self_attention:  # the growing keys' one copy: the cached keys are a view of the table
        assert keys.data_ptr() == table.data_ptr() and keys.stride(3) == table.size(-1), "the keys are a second copy"


def spy_on_key_tables(monkeypatch):
    """The key_table argument of every fourier_attention call of the module (a list it appends to)."""
    import fourierformer_fairseq.modules.fourier_multihead_attention as module

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("key_table"))
        return fourier_attention(*args, **kwargs)

    monkeypatch.setattr(module, "fourier_attention", spy)
    return seen


def test_decoding_keeps_the_key_table_a_step_at_a_time_and_reorders_it_with_the_beams(monkeypatch):
    """Causal self-attention in incremental decoding keeps its keys' table beside them: extended by
    each step's key in place, grown when its room runs out, reordered with the beams (a sentence
    twice, one dropped), and handed to the op at every step; the steps after the reorder equal
    decoding the reordered batch from the start."""
    seen = spy_on_key_tables(monkeypatch)
    m = make(self_attention=True, causal=True)
    block = DECLARATIONS["cpu"].key_table_keys
    T, B = 2 * block + 5, 3  # (past the first table's room: it is rebuilt once at least)
    x = torch.randn(T, B, E)
    order = torch.tensor([2, 0, 0])
    state, rooms = {}, set()
    for t in range(4):
        m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=False)
        assert_table_holds_the_cached_keys(m, state)
    m.reorder_incremental_state(state, order)
    assert_table_holds_the_cached_keys(m, state)
    xr = x[:, order]
    fresh = {}
    for t in range(4):
        m(xr[t:t + 1], xr[t:t + 1], xr[t:t + 1], incremental_state=fresh, need_weights=False)
    for t in range(4, T):
        a, _ = m(xr[t:t + 1], xr[t:t + 1], xr[t:t + 1], incremental_state=state, need_weights=False)
        b, _ = m(xr[t:t + 1], xr[t:t + 1], xr[t:t + 1], incremental_state=fresh, need_weights=False)
        assert_table_holds_the_cached_keys(m, state)
        rooms.add(m._get_input_buffer(state)["prev_key_table"].size(-1))
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert len(rooms) > 1, "the table never grew"
    full, _ = m(xr, xr, xr, need_weights=False)
    torch.testing.assert_close(a, full[-1:], rtol=1e-5, atol=1e-5)
    assert len(seen) == 2 * T + 1 and all(t is not None for t in seen[:-1]) and seen[-1] is None


def test_a_key_table_holds_under_a_changed_radius():
    """The key table holds the keys alone: decoding on after the radius changed equals the full
    forward under the new radius (a table of the old radius's sines would not)."""
    m = make(self_attention=True, causal=True, radius_shape="feature")
    T = 7
    x = torch.randn(T, 2, E)
    state = {}
    for t in range(3):
        m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=False)
    with torch.no_grad():
        m.radius.mul_(torch.linspace(0.5, 3.0, m.radius.numel()).reshape(m.radius.shape))
    steps = [m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=False)[0] for t in range(3, T)]
    full, _ = m(x, x, x, need_weights=False)
    torch.testing.assert_close(torch.cat(steps), full[3:], rtol=1e-5, atol=1e-5)


def test_static_keys_table_built_once_and_reordered(monkeypatch):
    """Encoder-decoder attention builds its keys' table at the first step, keeps it (the same
    tensor) while the keys are static, and reorders it when beam search shrinks the batch."""
    seen = spy_on_key_tables(monkeypatch)
    m = make(encoder_decoder_attention=True)
    enc = torch.randn(5, 3, E)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    q = torch.randn(3, 3, E)
    full, _ = m(q, enc, enc, key_padding_mask=kpm)
    state = {}
    for t in range(3):
        out, _ = m(q[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=state, static_kv=True)
        assert_table_holds_the_cached_keys(m, state)
        torch.testing.assert_close(out, full[t:t + 1], rtol=1e-5, atol=1e-6)
    assert seen[1] is not None and all(t is seen[1] for t in seen[2:]), "the static keys' table was rebuilt"
    new_order = torch.tensor([2, 0])
    m.reorder_incremental_state(state, new_order)
    assert_table_holds_the_cached_keys(m, state)
    out, _ = m(q[:1, new_order], None, None, incremental_state=state, static_kv=True)
    torch.testing.assert_close(out, full[:1, new_order], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["gaussian", "reference", "float64", "zero_attn"])
def test_no_key_table_where_nothing_reads_it(how):
    """The Gaussian kernel, the reference backend, float64 keys and add_zero_attn keep no table."""
    kw = {"gaussian": dict(kernel="gaussian"), "reference": dict(backend="reference"), "float64": {},
          "zero_attn": dict(add_zero_attn=True)}[how]
    m = make(self_attention=True, causal=True, **kw)
    x = torch.randn(3, 2, E)
    if how == "float64":
        m, x = m.double(), x.double()
    state = {}
    for t in range(3):
        m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=False)
    assert "prev_key_table" not in m._get_input_buffer(state)


def test_beamable_encoder_decoder_attention():
    """set_beam_size: keys stored once per sentence, queries of all beams share them."""
    beam = 3
    plain = make(encoder_decoder_attention=True)
    beamable = make(encoder_decoder_attention=True)
    beamable.load_state_dict(plain.state_dict())
    beamable.set_beam_size(beam)
    enc = torch.randn(5, 2, E).repeat_interleave(beam, dim=1)  # as generation expands the encoder output
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2]).repeat_interleave(beam, dim=0)
    q = torch.randn(1, 2 * beam, E)
    s1, s2 = {}, {}
    a, aw = plain(q, enc, enc, key_padding_mask=kpm, incremental_state=s1, static_kv=True, need_head_weights=True)
    b, bw = beamable(q, enc, enc, key_padding_mask=kpm, incremental_state=s2, static_kv=True, need_head_weights=True)
    assert beamable._get_input_buffer(s2)["prev_key"].size(0) == 2
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(aw, bw, rtol=1e-5, atol=1e-6)
    new_order = torch.tensor([2, 0, 1, 5, 5, 3])  # beams stay within their sentence
    plain.reorder_incremental_state(s1, new_order)
    beamable.reorder_incremental_state(s2, new_order)
    q2 = torch.randn(1, 2 * beam, E)
    a, _ = plain(q2, None, None, incremental_state=s1, static_kv=True)
    b, _ = beamable(q2, None, None, incremental_state=s2, static_kv=True)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_before_softmax_gives_log_weights():
    m = make(self_attention=True)
    x = torch.randn(4, 2, E)
    kpm = torch.tensor([[False] * 4, [False] * 3 + [True]])
    log_w, v = m(x, x, x, key_padding_mask=kpm, before_softmax=True)
    _, w = m(x, x, x, key_padding_mask=kpm, need_head_weights=True)
    assert log_w.shape == (2 * H, 4, 4) and v.shape == (2 * H, 4, D)
    torch.testing.assert_close(torch.softmax(log_w, -1).view(2, H, 4, 4).transpose(0, 1), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sign", ["positive", "negative", "mixed"])
@pytest.mark.parametrize("radius_shape,shape", [("scalar", ()), ("head", (H, 1)), ("feature", (H, D))])
def test_radius_and_input_gradients_match_the_float64_oracle(radius_shape, shape, sign):
    """The fused backward's radius (and input) gradient against autograd through the float64 oracle;
    tolerance from autograd through the plain float32 formula. The radius as initialised, or
    made negative (all entries; mixed: alternate entries), as training may leave it."""
    m = make(self_attention=True, radius_shape=radius_shape).train()
    assert m.radius.shape == shape and torch.all(m.radius == 0.7)
    with torch.no_grad():
        if sign == "negative" or (sign == "mixed" and m.radius.numel() == 1):
            m.radius.neg_()
        elif sign == "mixed":
            m.radius.view(-1)[::2] *= -1
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 2, E, generator=g, requires_grad=True)
    grad_out = torch.randn(5, 2, E, generator=g)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    out, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)
    (out * grad_out).sum().backward()
    grads = {}
    for name, attention, dtype in (("exact", oracle_attention, torch.float64), ("plain", plain_attention, torch.float32)):
        xx = x.detach().to(dtype).requires_grad_()
        r = m.radius.detach().to(dtype).requires_grad_()
        o, _ = independent_forward(m, xx, attention, dtype, radius=r, key_padding_mask=kpm)
        grads[name] = torch.autograd.grad((o * grad_out.to(dtype)).sum(), (xx, r))
    (exact_x, exact_r), (plain_x, plain_r) = grads["exact"], grads["plain"]
    assert m.radius.grad.shape == shape and exact_r.abs().max() > 1e-2  # a gradient worth checking
    scale = exact_r.abs().max().item()
    check_against_plain(m.radius.grad, plain_r, exact_r, "radius gradient", atol=1e-5 * scale)
    check_against_plain(x.grad, plain_x, exact_x, "input gradient", atol=1e-5 * exact_x.abs().max().item())
    before = m.radius.detach().clone()
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    torch.testing.assert_close(m.radius.detach(), before - 0.1 * m.radius.grad, rtol=0, atol=1e-7)


def direct_attention(q, k, v, radius, power, phi):
    """w_ij = prod_d phi(sinc(R_d (q_id - k_jd))), out = w v / sum_j w (the formula as written, any phi)."""
    B, Hq, N, Dq = q.shape
    R = radius.expand(Hq, Dq).reshape(1, Hq, 1, 1, Dq)
    x = R * (q.unsqueeze(3) - k.unsqueeze(2))
    s = torch.sin(x) / x
    elementwise = {"power": lambda t: t ** power, "abs": torch.abs, "relu": torch.relu, "sigmoid": torch.sigmoid}
    w = elementwise[phi](s).prod(-1)
    return torch.matmul(w, v) / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("phi,power", [("power", 4), ("power", 3), ("abs", 1), ("relu", 1), ("sigmoid", 1)])
def test_every_phi_matches_the_formula_forward_and_backward(phi, power):
    """Odd powers run on the reference backend, p = 4, |x|, ReLU and sigmoid on the fused CPU kernel:
    output and input gradient against the formula evaluated directly in float64."""
    m = make(self_attention=True, phi=phi, power=power).train()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 2, E, generator=g, requires_grad=True)
    grad_out = torch.randn(4, 2, E, generator=g)
    out, _ = m(x, x, x)
    (out * grad_out).sum().backward()
    results = {}
    for dtype in (torch.float64, torch.float32):
        xx = x.detach().to(dtype).requires_grad_()
        o, _ = independent_forward(m, xx, lambda q, k, v, r, power: direct_attention(q, k, v, r, power, phi), dtype)
        results[dtype] = (o, torch.autograd.grad((o * grad_out.to(dtype)).sum(), xx)[0])
    (exact, exact_g), (plain, plain_g) = results[torch.float64], results[torch.float32]
    check_against_plain(out, plain, exact, f"output ({phi}, p={power})", atol=1e-6)
    check_against_plain(x.grad, plain_g, exact_g, f"input gradient ({phi}, p={power})", atol=1e-5 * exact_g.abs().max().item())


def test_dropout_weights_and_output_match_an_independent_computation():
    """With dropout in training, the returned weights are the float64 oracle's weights / (1 - p)
    where kept and exactly 0 where dropped, about p of them are dropped, the fused output is
    computed with exactly those weights, and other seeds drop other entries."""
    p = 0.3
    m = make(self_attention=True, dropout=p).train()
    T, B = 40, 2
    x = torch.randn(T, B, E, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(11)
    with torch.no_grad():
        out, w = m(x, x, x, need_head_weights=True)
        _, exact_w = independent_forward(m, x, oracle_with_weights, torch.float64)
    exact_w = exact_w.transpose(0, 1)
    dropped = w == 0
    kept_ratio = w.double()[~dropped] * (1 - p) / exact_w[~dropped]
    assert (kept_ratio - 1).abs().max() < 1e-4, "kept weights are the undropped weights / (1 - p)"
    # n = H*B*T*T = 12800 Bernoulli(p) draws: standard deviation of the fraction 0.004; allow 5 of them
    fraction = dropped.double().mean().item()
    assert abs(fraction - p) < 5 * math.sqrt(p * (1 - p) / dropped.numel()), fraction
    v = split_heads(F.linear(x.double(), m.v_proj.weight.double(), m.v_proj.bias.double()), H)
    heads = torch.matmul(w.transpose(0, 1).double(), v).permute(2, 0, 1, 3).reshape(T, B, E)
    from_weights = F.linear(heads, m.out_proj.weight.double(), m.out_proj.bias.double())
    assert max_abs_error(out, from_weights) < 1e-5, "the fused output uses the returned (dropped) weights"
    torch.manual_seed(12)
    with torch.no_grad():
        _, w2 = m(x, x, x, need_head_weights=True)
    agree = ((w2 == 0) == dropped).double().mean().item()
    assert agree < 1 - p * (1 - p), f"another seed must drop other entries (agreement {agree:.3f})"
    assert not torch.equal(dropped[0], dropped[1]), "heads draw different masks"


def test_dropout_only_in_training():
    m = make(self_attention=True, dropout=0.5)
    x = torch.randn(5, 2, E)
    torch.testing.assert_close(m.eval()(x, x, x)[0], m(x, x, x)[0])
    m.train()
    torch.manual_seed(1)
    a = m(x, x, x)[0]
    torch.manual_seed(2)
    b = m(x, x, x)[0]
    assert not torch.allclose(a, b)


def test_clear_errors_for_bad_options():
    with pytest.raises(ValueError, match="phi must be one of"):
        FourierMultiheadAttention(E, H, phi="cos")
    with pytest.raises(ValueError, match="power must be a positive integer"):
        FourierMultiheadAttention(E, H, power=0)
    with pytest.raises(ValueError, match="radius_shape must be one of"):
        FourierMultiheadAttention(E, H, radius_shape="row")
    with pytest.raises(ValueError, match="radius_init must be positive"):
        FourierMultiheadAttention(E, H, radius_init=-1.0)
    with pytest.raises(ValueError, match="xFormers"):
        FourierMultiheadAttention(E, H, xformers_att_config='{"name": "scaled_dot_product"}')
    m = make(self_attention=True, phi="power", power=3)
    x = torch.randn(3, 1, E)
    with pytest.raises(ValueError, match="before_softmax"):
        m(x, x, x, before_softmax=True)


@pytest.mark.parametrize("retain", [False, True])
def test_retain_dropout_keeps_attention_dropout_at_inference(retain):
    """fairseq's --retain-dropout (make_generation_fast_(retain_dropout=True) sets the dropout
    modules' apply_during_inference): in eval mode the attention then still drops weights
    (p = --attention-dropout, a fresh mask per call), and without it never does."""
    from fairseq_helpers import TRANSLATION_DIMS, build_model

    model, _ = build_model("fourierformer_iwslt_de_en", dims=TRANSLATION_DIMS, extra=["--attention-dropout", "0.4"])
    model.eval()
    if retain:
        model.make_generation_fast_(retain_dropout=True)
    attn = model.encoder.layers[0].self_attn
    assert isinstance(attn, FourierMultiheadAttention)
    assert attn.attention_dropout_p() == (0.4 if retain else 0.0)
    x = torch.randn(7, 2, attn.embed_dim)
    with torch.no_grad():
        torch.manual_seed(1)
        a, _ = attn(x, x, x, need_weights=False)
        torch.manual_seed(2)
        b, _ = attn(x, x, x, need_weights=False)
        _, w = attn(x, x, x, need_weights=True, need_head_weights=True)  # per head
    assert torch.equal(a, b) != retain
    assert ((w == 0).float().mean().item() > 0.2) == retain  # about p of the weights dropped
