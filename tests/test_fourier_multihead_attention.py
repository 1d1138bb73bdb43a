"""FourierMultiheadAttention: the MultiheadAttention contract, caching, masking, radius, errors."""
import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from fourierformer_fairseq.modules import ATTENTION_REGISTRY, FourierMultiheadAttention, build_attention
from fourierformer_fairseq.ops import fourier_attention_reference

E, H = 16, 4
D = E // H


def make(**kw):
    torch.manual_seed(0)
    kw.setdefault("power", 2)
    kw.setdefault("radius_init", 0.7)
    return FourierMultiheadAttention(E, H, **kw).eval()


def split_heads(x):  # (T, B, E) -> (B, H, T, D)
    T, B, _ = x.shape
    return x.view(T, B, H, D).permute(1, 2, 0, 3)


def test_registered_and_a_multihead_attention():
    assert ATTENTION_REGISTRY["fourier_multihead_attention"] is FourierMultiheadAttention
    m = build_attention("fourier_multihead_attention", E, H, self_attention=True, power=4)
    assert isinstance(m, MultiheadAttention) and m.power == 4
    # same parameter names as the stock module, plus the radius
    stock = MultiheadAttention(E, H, self_attention=True)
    assert set(dict(m.named_parameters())) == set(dict(stock.named_parameters())) | {"radius"}
    with pytest.raises(ValueError, match="unknown attention"):
        build_attention("no_such_attention", E, H)


@pytest.mark.parametrize("radius_shape", ["scalar", "head", "feature"])
def test_matches_op_reference_on_the_projections(radius_shape):
    """Only scoring/normalisation change: out = out_proj(fourier_attention(q_proj x, k_proj x, v_proj x))."""
    m = make(self_attention=True, radius_shape=radius_shape)
    with torch.no_grad():
        m.radius.copy_(torch.rand_like(m.radius) + 0.5)
    x = torch.randn(5, 3, E)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    out, w = m(x, x, x, key_padding_mask=kpm, need_head_weights=True)
    ref, ref_w = fourier_attention_reference(
        split_heads(m.q_proj(x)), split_heads(m.k_proj(x)), split_heads(m.v_proj(x)), m.radius, power=2,
        key_padding_mask=kpm, need_weights=True,
    )
    ref = m.out_proj(ref.permute(2, 0, 1, 3).reshape(5, 3, E))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w, ref_w.transpose(0, 1), rtol=1e-5, atol=1e-6)


def test_output_and_weight_shapes_match_stock_contract():
    stock = MultiheadAttention(E, H, self_attention=True).eval()
    # stock's shortcut through F.multi_head_attention_forward ignores need_head_weights; its own
    # path (taken with incremental_state / static_kv, as in the decoder) has the documented shapes
    stock._set_skip_embed_dim_check()
    m = make(self_attention=True)
    x = torch.randn(6, 2, E)
    for kwargs in ({"need_weights": False}, {"need_weights": True}, {"need_head_weights": True}):
        a, aw = stock(x, x, x, **kwargs)
        b, bw = m(x, x, x, **kwargs)
        assert a.shape == b.shape
        assert (aw is None) == (bw is None)
        if aw is not None:
            assert aw.shape == bw.shape
    # encoder-decoder attention with different kdim
    cross = make(kdim=12, vdim=12, encoder_decoder_attention=True)
    enc = torch.randn(7, 2, 12)
    out, w = cross(x, enc, enc)
    assert out.shape == (6, 2, E) and w.shape == (2, 6, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 6))


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


def test_additive_mask_and_future_mask_fast_path():
    """The decoder's future mask runs as causal=True; it must equal the generic additive-mask path."""

    class NoCausalDetection(FourierMultiheadAttention):
        @staticmethod
        def _is_future_mask(attn_mask, tgt_len, src_len):
            return False

    m = make(self_attention=True).train()
    generic = NoCausalDetection(E, H, self_attention=True, power=2, radius_init=0.7).train()
    generic.load_state_dict(m.state_dict())
    T = 7
    future = torch.triu(torch.full((T, T), float("-inf")), 1)
    assert FourierMultiheadAttention._is_future_mask(future, T, T)
    assert not FourierMultiheadAttention._is_future_mask(future.T.contiguous(), T, T)
    x = torch.randn(T, 3, E, requires_grad=True)
    outs, grads = [], []
    for mod in (m, generic):
        mod.zero_grad()
        x.grad = None
        out, _ = mod(x, x, x, attn_mask=future, need_weights=False)
        out.square().sum().backward()
        outs.append(out)
        grads.append((x.grad.clone(), mod.radius.grad.clone()))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-4, atol=1e-5)
    # and the first query sees only the first key
    _, w = m.eval()(x, x, x, attn_mask=future, need_head_weights=True)
    assert torch.all(w[:, :, 0, 1:] == 0)


@pytest.mark.parametrize("add_zero_attn", [False, True])
def test_incremental_self_attention_equals_full(add_zero_attn):
    m = make(self_attention=True, add_zero_attn=add_zero_attn)
    T = 6
    x = torch.randn(T, 2, E)
    future = torch.triu(torch.full((T, T), float("-inf")), 1)
    full, _ = m(x, x, x, attn_mask=future)
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


@pytest.mark.parametrize("radius_shape,shape", [("scalar", ()), ("head", (H, 1)), ("feature", (H, D))])
def test_gradients_reach_the_radius(radius_shape, shape):
    m = make(self_attention=True, radius_shape=radius_shape).train()
    assert m.radius.shape == shape and torch.all(m.radius == 0.7)
    x = torch.randn(5, 2, E)
    out, _ = m(x, x, x, need_weights=False)
    out.square().sum().backward()
    assert m.radius.grad is not None and m.radius.grad.shape == shape
    assert torch.all(torch.isfinite(m.radius.grad)) and m.radius.grad.abs().sum() > 0
    before = m.radius.detach().clone()
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    assert not torch.equal(before, m.radius.detach())


@pytest.mark.parametrize("phi,power", [("power", 4), ("power", 3), ("abs", 1), ("relu", 1), ("sigmoid", 1)])
def test_every_phi_runs_forward_and_backward(phi, power):
    m = make(self_attention=True, phi=phi, power=power).train()
    x = torch.randn(4, 2, E, requires_grad=True)
    out, _ = m(x, x, x)
    out.sum().backward()
    assert torch.all(torch.isfinite(out)) and torch.all(torch.isfinite(x.grad))


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
