"""The global filter (GFNet-style token mixing): the FFT convolution, the module, the architectures.

Values are checked against a plain float64 direct O(N^2) sum of the same convolution written here
(``direct_filter``: y[b, c, i] = sum_j h_c[i - j] x[b, c, j], padded positions zeroed, causal:
j <= i), importing nothing of the package's arithmetic. Tolerances: in float64 the FFT and the
direct sum agree to rounding (1e-10 relative, norm-wise; measured about 1e-16); in float32 the
FFT's norm-wise relative error is at most 10 times the same direct sum run plainly in float32,
floored at float32's eps (the FFT's error grows like log n eps, the direct sum's like N eps per term).
The contract it shares with the other attention kinds (fairseq's MultiheadAttention interface and
what it refuses, incremental decoding of a model, beam search, reordering) is tested over every
kind in tests/modules/test_attention_kinds.py.
"""
import os

import pytest
import torch
import torch.nn.functional as F

from fairseq_helpers import (
    LM_DIMS,
    TRANSLATION_DIMS,
    build_model,
    create_markov_lm_data,
    eval_lm_main,
    preprocess_lm_data,
    train_language_model,
    unigram_perplexity,
)
from fourierformer_fairseq.modules import GlobalFilterMixer
from helpers import norm_relative_error as rel
from helpers import padding_mask
from fourierformer_fairseq.ops.global_filter import global_filter

E, H = 8, 2
D = E // H
L = 12  # max_positions of the modules here


def direct_filter(x, taps, causal, key_padding_mask=None):
    """The plain sum: x (B, C, N), taps (C, L) causal (lags 0..L-1) or (C, 2L - 1) (lags -(L-1)..L-1)."""
    B, C, N = x.shape
    x = x.clone()
    if key_padding_mask is not None:
        x[key_padding_mask.unsqueeze(1).expand(B, C, N)] = 0
    center = 0 if causal else (taps.size(1) - 1) // 2
    y = torch.zeros_like(x)
    for i in range(N):
        for j in range(N):
            lag = i - j
            if causal and lag < 0:
                continue
            y[:, :, i] = y[:, :, i] + taps[:, center + lag] * x[:, :, j]
    if key_padding_mask is not None:
        y = y.masked_fill(key_padding_mask.unsqueeze(1), 0)
    return y


def make(causal, seed=0, **kw):
    torch.manual_seed(seed)
    return GlobalFilterMixer(E, H, self_attention=True, causal=causal, max_positions=L, **kw).eval()


def module_reference(m, x, key_padding_mask=None):
    """out_proj(direct_filter(v_proj(x))) from m's parameters, in float64, without the module."""
    P = {n: p.detach().double() for n, p in m.named_parameters()}
    v = F.linear(x.double(), P["v_proj.weight"], P["v_proj.bias"])  # (T, B, E)
    y = direct_filter(v.permute(1, 2, 0), P["filter"], m.causal, key_padding_mask).permute(2, 0, 1)
    return F.linear(y, P["out_proj.weight"], P["out_proj.bias"])


# ============================================================================ the convolution


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N", [1, 5, 8, 12])
def test_fft_filter_equals_the_direct_sum(causal, N):
    g = torch.Generator().manual_seed(N)
    taps = torch.randn(3, L if causal else 2 * L - 1, generator=g, dtype=torch.float64)
    x = torch.randn(2, 3, N, generator=g, dtype=torch.float64)
    kpm = torch.zeros(2, N, dtype=torch.bool)
    kpm[1, : N // 2] = True  # left padding in the second sequence
    exact = direct_filter(x, taps, causal, kpm)
    assert rel(global_filter(x, taps, causal, kpm), exact) <= 1e-10
    # float32: against the same plain sum in float32
    fft32 = global_filter(x.float(), taps.float(), causal, kpm)
    plain32 = direct_filter(x.float(), taps.float(), causal, kpm)
    assert fft32.dtype == torch.float32
    assert rel(fft32, exact) <= 10 * max(rel(plain32, exact), torch.finfo(torch.float32).eps)


def test_the_convolution_is_linear_not_circular():
    """The last position's value reaches the first output only through lag -(N-1) (never through a wrap)."""
    N = 6
    taps = torch.zeros(1, 2 * L - 1, dtype=torch.float64)
    taps[0, L - 1 + 1] = 1.0  # h[+1] = 1: y_i = x_{i-1}
    x = torch.arange(1.0, N + 1, dtype=torch.float64).view(1, 1, N)
    y = global_filter(x, taps, causal=False)
    torch.testing.assert_close(y[0, 0], torch.tensor([0.0, 1, 2, 3, 4, 5], dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_the_direct_sum(causal):
    g = torch.Generator().manual_seed(7)
    taps = torch.randn(2, L if causal else 2 * L - 1, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 2, 7, generator=g, dtype=torch.float64, requires_grad=True)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[0, 5:] = True
    w = torch.randn(2, 2, 7, generator=g, dtype=torch.float64)
    (global_filter(x, taps, causal, kpm) * w).sum().backward()
    got = (x.grad.clone(), taps.grad.clone())
    x.grad = taps.grad = None
    (direct_filter(x, taps, causal, kpm) * w).sum().backward()
    for a, b in zip(got, (x.grad, taps.grad)):
        assert rel(a, b) <= 1e-10
    assert torch.all(got[0][0, :, 5:] == 0), "padded positions get no gradient"
    assert torch.autograd.gradcheck(lambda x_, t_: global_filter(x_, t_, causal, kpm), (x.detach().requires_grad_(),
                                                                                         taps.detach().requires_grad_()))


def test_longer_than_max_positions_raises():
    with pytest.raises(ValueError, match="at most 12 positions"):
        global_filter(torch.randn(1, 1, 13), torch.randn(1, L), causal=True)


# ============================================================================ the module


@pytest.mark.parametrize("left", [False, True])
def test_encoder_module_equals_the_direct_sum_with_padding(left):
    m = make(causal=False).double()
    T, lengths = 9, [9, 6, 2]
    x = torch.randn(T, 3, E, dtype=torch.float64)
    kpm = padding_mask(lengths, T, left)
    out, w = m(x, x, x, key_padding_mask=kpm, need_weights=False)
    assert w is None
    assert rel(out[~kpm.T], module_reference(m, x, kpm)[~kpm.T]) <= 1e-10
    # each padded sentence equals the sentence alone: padding is invisible
    for b, n in enumerate(lengths):
        real = slice(T - n, T) if left else slice(0, n)
        single, _ = m(x[real, b:b + 1], x[real, b:b + 1], x[real, b:b + 1], need_weights=False)
        torch.testing.assert_close(out[real, b:b + 1], single, rtol=0, atol=1e-12)


def test_causal_module_equals_the_direct_sum_and_never_looks_ahead():
    m = make(causal=True).double()
    x = torch.randn(10, 2, E, dtype=torch.float64)
    out, _ = m(x, x, x, need_weights=False)
    assert rel(out, module_reference(m, x)) <= 1e-10
    x2 = x.clone()
    x2[6:] = torch.randn(4, 2, E, dtype=torch.float64)
    out2, _ = m(x2, x2, x2, need_weights=False)
    torch.testing.assert_close(out2[:6], out[:6], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_incremental_decoding_equals_the_full_forward(dtype):
    """float64: to rounding (1e-10); float32: the steps (direct sums) and the full forward (FFT) each
    within the float32 tolerance of the module docstring of the float64 result."""
    m = make(causal=True).to(dtype)
    T = L
    x = torch.randn(T, 3, E, dtype=dtype)
    kpm = padding_mask([12, 9, 4], T, left=True)  # left-padded prompts, as in batched generation
    with torch.no_grad():
        full, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)
        state = {}
        steps = [m(x[t:t + 1], x[t:t + 1], x[t:t + 1], key_padding_mask=kpm[:, : t + 1], incremental_state=state,
                   need_weights=False)[0] for t in range(T)]
    steps = torch.cat(steps)
    real = ~kpm.T
    if dtype == torch.float64:
        assert rel(steps[real], full[real]) <= 1e-10
    else:
        exact = module_reference(m, x, kpm)
        m64 = make(causal=True).double()
        m64.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
        bound = 10 * max(rel(module_reference(m64, x.float().double(), kpm).float(), exact),
                         torch.finfo(torch.float32).eps)
        assert rel(steps[real], exact[real]) <= bound and rel(full[real], exact[real]) <= bound
    cache = m._get_input_buffer(state)
    assert set(cache) == {"prefix_value"} and cache["prefix_value"].shape == (3, H, T, D)


@pytest.mark.parametrize("chunks", [(5, 4, 3), (2, 2, 2, 6), (12,)])
def test_incremental_steps_of_several_positions_equal_the_full_forward(chunks):
    """attend_step with more than one new position at a time (a prompt fed in pieces), with
    left padding: float64, to rounding (1e-10) of the full forward."""
    m = make(causal=True).double()
    T = sum(chunks)
    x = torch.randn(T, 3, E, dtype=torch.float64)
    kpm = padding_mask([12, 9, 4], T, left=True)
    with torch.no_grad():
        full, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)
        state, steps, t = {}, [], 0
        for n in chunks:
            steps.append(m(x[t:t + n], x[t:t + n], x[t:t + n], key_padding_mask=kpm[:, :t + n],
                           incremental_state=state, need_weights=False)[0])
            t += n
    steps = torch.cat(steps)
    real = ~kpm.T
    assert steps.shape == full.shape and rel(steps[real], full[real]) <= 1e-10
    assert (steps[~real] == 0).all() or rel(steps[~real], full[~real]) <= 1e-10


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_half_inputs_are_filtered_in_float32(dtype, causal):
    """float16 / bfloat16 inputs are computed in float32 (the op's promise) and returned in their
    dtype: the result is the float32 filter of the same values, rounded once to the input's dtype
    (bit for bit), and within that rounding (half an ulp of the largest output, norm-wise) of the
    float64 direct sum; the gradients reach the input in its dtype and the float32 taps."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 10, generator=g).to(dtype).requires_grad_()
    taps = (torch.randn(6, 12 if causal else 23, generator=g) * 0.3).requires_grad_()
    y = global_filter(x, taps, causal)
    assert y.dtype == dtype
    assert torch.equal(y, global_filter(x.detach().float(), taps.detach(), causal).to(dtype))
    exact = direct_filter(x.detach().double(), taps.detach().double(), causal)
    assert rel(y, exact) <= torch.finfo(dtype).eps
    y.float().pow(2).sum().backward()
    assert x.grad.dtype == dtype and taps.grad.dtype == torch.float32 and torch.isfinite(taps.grad).all()


def test_the_module_under_autocast_filters_in_float32():
    """Under CPU autocast to bfloat16 the projections run in bfloat16, the filter in float32 (its
    output is the float32 filter of the bfloat16 values, rounded to bfloat16): the module's
    output is that of the same module fed the projections' bfloat16 values."""
    m = make(causal=False)
    x = torch.randn(7, 2, E)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        v = m.v_proj(x)
        y = global_filter(v.permute(1, 2, 0), m.filter, False)
        out, _ = m(x, x, x, need_weights=False)
    assert v.dtype == torch.bfloat16 and y.dtype == torch.bfloat16
    assert torch.equal(y, global_filter(v.permute(1, 2, 0).float(), m.filter, False).to(torch.bfloat16))
    exact = module_reference(m, x.to(torch.bfloat16).float())
    assert rel(out.float(), exact) <= 0.05  # bfloat16's eps is 2^-7: the projections' rounding


def test_what_it_cannot_do_raises_clearly():
    m = make(causal=False)
    x = torch.randn(4, 1, E)
    with pytest.raises(ValueError, match="forms no attention weights.*need_weights=False"):
        m(x, x, x)
    with pytest.raises(ValueError, match="attn_mask"):
        m(x, x, x, attn_mask=torch.zeros(4, 4), need_weights=False)
    with pytest.raises(ValueError, match="before_softmax"):
        m(x, x, x, before_softmax=True, need_weights=False)
    with pytest.raises(ValueError, match="encoder-decoder attention stays softmax"):
        GlobalFilterMixer(E, H, encoder_decoder_attention=True, max_positions=L)
    with pytest.raises(ValueError, match="max_positions"):
        GlobalFilterMixer(E, H, self_attention=True)
    with pytest.raises(ValueError, match="add_bias_kv"):
        GlobalFilterMixer(E, H, self_attention=True, max_positions=L, add_bias_kv=True)
    with pytest.raises(ValueError, match="init_std must be positive"):
        GlobalFilterMixer(E, H, self_attention=True, max_positions=L, init_std=0)
    assert m.q_proj is None and m.k_proj is None
    assert not any(n.startswith(("q_proj", "k_proj")) for n in m.state_dict())


# ============================================================================ architectures


def test_architectures_build_the_filter_at_self_attention_sites_only():
    model, args = build_model("gfnet_iwslt_de_en", dims=TRANSLATION_DIMS)
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    assert isinstance(enc.self_attn, GlobalFilterMixer) and not enc.self_attn.causal
    assert enc.self_attn.filter.shape == (16, 2 * args.max_source_positions - 1)
    assert isinstance(dec.self_attn, GlobalFilterMixer) and dec.self_attn.causal
    assert dec.self_attn.filter.shape == (16, args.max_target_positions)
    assert not isinstance(dec.encoder_attn, GlobalFilterMixer)
    lm, args = build_model("gfnet_lm_wiki103_small", dims=LM_DIMS, task="language_modeling")
    attn = lm.decoder.layers[0].self_attn
    assert isinstance(attn, GlobalFilterMixer) and attn.causal and attn.filter.shape == (16, 256)
    model, _ = build_model("gfnet_iwslt_de_en", dims=TRANSLATION_DIMS, extra=["--gfnet-attention", "encoder"])
    assert not isinstance(model.decoder.layers[0].self_attn, GlobalFilterMixer)
    with pytest.raises(ValueError, match="--gfnet-attention 'cross'.*cannot replace.*stays softmax"):
        build_model("gfnet_iwslt_de_en", dims=TRANSLATION_DIMS, extra=["--gfnet-attention", "cross"])
    with pytest.raises(ValueError, match="--gfnet-init-std must be positive"):
        build_model("gfnet_iwslt_de_en", dims=TRANSLATION_DIMS, extra=["--gfnet-init-std", "-1"])


@pytest.mark.parametrize("std", [None, 0.5])
def test_gfnet_init_std_sets_the_filters_initial_taps(std):
    """--gfnet-init-std (default GFNet's 0.02): the initial taps of every filter are N(0, std^2),
    measured over the model's taps (thousands of them: within 5 %)."""
    extra = [] if std is None else ["--gfnet-init-std", str(std)]
    model, _ = build_model("gfnet_iwslt_de_en", dims=TRANSLATION_DIMS, extra=extra)
    taps = torch.cat([p.detach().flatten() for n, p in model.named_parameters() if n.endswith("self_attn.filter")])
    assert taps.numel() > 1000
    assert taps.std().item() == pytest.approx(0.02 if std is None else std, rel=0.05)
    assert abs(taps.mean().item()) < 0.1 * taps.std().item()


def test_language_model_trains_resumes_and_evaluates_with_stock_fairseq(tmp_path):
    """fairseq-train for 20 updates, resumed from checkpoint_last to 40, then fairseq-eval-lm."""
    data_dir = str(tmp_path / "data")
    os.makedirs(data_dir)
    create_markov_lm_data(data_dir)
    preprocess_lm_data(data_dir)
    save_dir = str(tmp_path / "ckpt")
    common = ["--max-tokens", "128", "--save-interval-updates", "20"]
    train_language_model(data_dir, save_dir, "gfnet_lm_wiki103_small", common + ["--max-update", "20"], max_epoch=100)
    first = torch.load(os.path.join(save_dir, "checkpoint_last.pt"))
    assert first["optimizer_history"][-1]["num_updates"] == 20
    train_language_model(data_dir, save_dir, "gfnet_lm_wiki103_small", common + ["--max-update", "40"], max_epoch=100)
    second = torch.load(os.path.join(save_dir, "checkpoint_last.pt"))
    assert second["optimizer_history"][-1]["num_updates"] == 40
    name = "decoder.layers.0.self_attn.filter"
    assert not torch.equal(first["model"][name], second["model"][name])
    result = eval_lm_main(data_dir, os.path.join(save_dir, "checkpoint_last.pt"))
    # it learned from context: under half the unigram perplexity of the test set (which no model
    # that ignores its context can reach; the threshold of tests/runs/test_stock_cli.py's LMs)
    threshold = unigram_perplexity(os.path.join(data_dir, "train.out"), os.path.join(data_dir, "test.out")) / 2
    assert 1 < float(result["perplexity"]) < threshold, (result["perplexity"], threshold)


def test_language_model_learns_from_two_positions_back(tmp_path):
    """The GFNet language model on text where only the letter two back predicts the next: after a
    fixed number of updates its test perplexity is under half the unigram perplexity, which
    neither a unigram nor a bigram model can reach: the filter must mix positions (cut to lag 0,
    the model scored 21.1 against the threshold 10.4; 60 updates were too few to pass)."""
    data_dir = str(tmp_path / "data")
    os.makedirs(data_dir)
    create_markov_lm_data(data_dir, lag=2)
    preprocess_lm_data(data_dir)
    save_dir = str(tmp_path / "ckpt")
    train_language_model(data_dir, save_dir, "gfnet_lm_wiki103_small", ["--max-tokens", "128", "--max-update", "200"],
                         max_epoch=100)
    result = eval_lm_main(data_dir, os.path.join(save_dir, "checkpoint_last.pt"))
    threshold = unigram_perplexity(os.path.join(data_dir, "train.out"), os.path.join(data_dir, "test.out")) / 2
    assert 1 < float(result["perplexity"]) < threshold, (result["perplexity"], threshold)
