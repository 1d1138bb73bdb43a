"""The contract every attention kind holds, one test per clause, over the three kinds: the Fourier
attention, the Performer and the global filter (GFNet).

- The module is fairseq's ``MultiheadAttention``: the class, the parameter names (the stock
  module's, less the query and key projections for a kind that reads only the values, plus the
  kind's own), the shapes of the output and of the weights with ``need_weights`` /
  ``need_head_weights``, ``attn_mask``, ``before_softmax`` and encoder-decoder attention. What a
  kind cannot do it declares (``supports_need_weights``, ``supports_attn_mask``,
  ``supports_before_softmax``, ``uses_queries_keys``; the global filter takes no
  encoder-decoder attention) and refuses with a ``ValueError`` that names it: the test checks the
  declarations against the table below and the refusals against the declarations.
- Incremental decoding equals the full forward: of a translation model (each step's output and
  its alignment) and of a language model.
- Beam search (fairseq's ``SequenceGenerator``: the incremental cache, beam reordering,
  beamable encoder attention) scores each hypothesis as a teacher-forced full forward does.
- ``reorder_incremental_state`` follows the new order: decoding on after a reorder equals
  decoding the reordered batch from the start.

Tolerances, per kind, as each kind's own tests set them: the Fourier attention and the Performer,
float32 steps against the float32 full forward, 1e-5 absolute (the beam's log-probabilities
1e-4); the global filter's steps are direct sums and its full forward an FFT, so they agree to
float32's error of the two summations through two layers: 1e-4 absolute and relative. The
reorder is index selection: float32 within 1e-6, float64 (the global filter) within 1e-12.
"""
import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention
from fairseq.sequence_generator import SequenceGenerator

from fairseq_helpers import LM_DIMS, build_model, eval_model, random_tokens
from fourierformer_fairseq.modules import FourierMultiheadAttention, GlobalFilterMixer, PerformerMultiheadAttention

E, H = 16, 4

# what each kind is and says it can do
KINDS = {
    "fourier": dict(cls=FourierMultiheadAttention, options=dict(power=2, radius_init=0.7), own={"radius"},
                    queries_keys=True, weights=True, attn_mask=True, before_softmax=True, cross=True,
                    translation="fourierformer_iwslt_de_en", lm="fourierformer_lm_wiki103_small",
                    steps=dict(rtol=0, atol=1e-5)),
    "performer": dict(cls=PerformerMultiheadAttention, options=dict(num_features=64), own=set(),
                      queries_keys=True, weights=True, attn_mask=False, before_softmax=False, cross=True,
                      translation="performer_iwslt_de_en", lm="performer_lm_wiki103_small",
                      steps=dict(rtol=0, atol=1e-5)),
    "gfnet": dict(cls=GlobalFilterMixer, options=dict(max_positions=12), own={"filter"},
                  queries_keys=False, weights=False, attn_mask=False, before_softmax=False, cross=False,
                  translation="gfnet_iwslt_de_en", lm="gfnet_lm_wiki103_small",
                  steps=dict(rtol=1e-4, atol=1e-4)),
}


def make(kind, torch_seed=0, **kw):
    torch.manual_seed(torch_seed)
    spec = KINDS[kind]
    return spec["cls"](E, H, **{**spec["options"], **kw}).eval()


# ============================================================================ the module


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_module_holds_fairseqs_multihead_attention_interface(kind):
    spec = KINDS[kind]
    cls = spec["cls"]
    assert issubclass(cls, MultiheadAttention)
    declared = dict(queries_keys=cls.uses_queries_keys, weights=cls.supports_need_weights,
                    attn_mask=cls.supports_attn_mask, before_softmax=cls.supports_before_softmax)
    assert declared == {key: spec[key] for key in declared}, f"{kind} declares {declared}"

    m = make(kind, self_attention=True)
    stock = MultiheadAttention(E, H, self_attention=True).eval()
    stock_names = set(dict(stock.named_parameters()))
    if not spec["queries_keys"]:
        stock_names = {n for n in stock_names if not n.startswith(("q_proj.", "k_proj."))}
        assert m.q_proj is None and m.k_proj is None
    assert set(dict(m.named_parameters())) == stock_names | spec["own"]

    # output and weights as the stock module's own path (taken with an incremental state, as in the
    # decoder) returns them; its shortcut through F.multi_head_attention_forward ignores need_head_weights
    stock._set_skip_embed_dim_check()
    T, B = 6, 2
    x = torch.randn(T, B, E, generator=torch.Generator().manual_seed(1))
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, -2:] = True
    for asked in ({"need_weights": False}, {"need_weights": True}, {"need_head_weights": True}):
        want, want_w = stock(x, x, x, key_padding_mask=kpm, **asked)
        if asked.get("need_weights", True) and not spec["weights"]:
            with pytest.raises(ValueError, match="forms no attention weights.*need_weights=False"):
                m(x, x, x, key_padding_mask=kpm, **asked)
            continue
        out, w = m(x, x, x, key_padding_mask=kpm, **asked)
        assert out.shape == want.shape == (T, B, E) and torch.isfinite(out).all()
        assert (w is None) == (want_w is None)
        if w is not None:
            assert w.shape == want_w.shape
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
            assert torch.all(w[..., 1, :, -2:] == 0), "padded keys get no weight"  # (heads,) batch, tgt, src

    mask = torch.randn(T, T, generator=torch.Generator().manual_seed(2))
    ask = {"need_weights": spec["weights"]}
    if spec["attn_mask"]:
        out, _ = m(x, x, x, attn_mask=mask, **ask)
        assert out.shape == (T, B, E) and not torch.allclose(out, m(x, x, x, **ask)[0])
    else:
        with pytest.raises(ValueError, match="attn_mask=None"):
            m(x, x, x, attn_mask=mask, **ask)
    if spec["before_softmax"]:
        scores, values = m(x, x, x, before_softmax=True)
        assert scores.shape == (B * H, T, T) and values.shape == (B * H, T, E // H)
    else:
        with pytest.raises(ValueError, match="before_softmax"):
            m(x, x, x, before_softmax=True, **ask)

    S = 7
    if spec["cross"]:
        cross = make(kind, kdim=12, vdim=12, encoder_decoder_attention=True)
        enc = torch.randn(S, B, 12, generator=torch.Generator().manual_seed(3))
        out, w = cross(x, enc, enc)
        assert out.shape == (T, B, E) and w.shape == (B, T, S)
        torch.testing.assert_close(w.sum(-1), torch.ones(B, T))
    else:
        with pytest.raises(ValueError, match="encoder-decoder attention stays softmax"):
            make(kind, kdim=12, vdim=12, encoder_decoder_attention=True)


# ============================================================================ decoding


TRANSLATION_CASES = [
    pytest.param("fourier", [], id="fourier"),
    pytest.param("fourier", ["--fourier-power", "4", "--fourier-radius-shape", "head"], id="fourier-p4-head-radius"),
    pytest.param("fourier", ["--fourier-radius-shape", "feature", "--fourier-phi", "relu", "--fourier-power", "1"],
                 id="fourier-relu-feature-radius"),
    pytest.param("performer", [], id="performer"),
    pytest.param("gfnet", [], id="gfnet"),
]


@pytest.mark.parametrize("kind,extra", TRANSLATION_CASES)
def test_incremental_decoding_of_a_translation_model_equals_the_full_forward(kind, extra):
    model = eval_model(KINDS[kind]["translation"], extra=extra)
    d = model.decoder.dictionary
    g = torch.Generator().manual_seed(0)
    src = random_tokens(d, [7, 5, 3], pad_left=True, generator=g)
    prev = random_tokens(d, [6, 6, 6], pad_left=False, generator=g)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=src.ne(d.pad()).sum(1))
        full, full_extra = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state) for t in range(prev.size(1))]
    tol = KINDS[kind]["steps"]
    torch.testing.assert_close(torch.cat([out for out, _ in steps], dim=1), full, **tol)
    attn = torch.cat([extra["attn"][0] for _, extra in steps], dim=1)
    torch.testing.assert_close(attn, full_extra["attn"][0], **tol)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_incremental_decoding_of_a_language_model_equals_the_full_forward(kind):
    torch.manual_seed(0)
    model, _ = build_model(KINDS[kind]["lm"], dims=LM_DIMS, task="language_modeling")
    model.eval()
    d = model.decoder.dictionary
    tokens = random_tokens(d, [9, 9], pad_left=False, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(tokens)
        state = {}
        steps = [model(tokens[:, : t + 1], incremental_state=state)[0] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, **KINDS[kind]["steps"])


BEAM_CASES = [
    pytest.param("fourier", [], id="fourier"),
    pytest.param("performer", ["--performer-kernel", "softmax", "--performer-features", "0"], id="performer-softmax"),
    pytest.param("performer", ["--performer-kernel", "fourier_rf", "--performer-features", "8"],
                 id="performer-fourier_rf"),
    pytest.param("gfnet", [], id="gfnet"),
]


@pytest.mark.parametrize("kind,extra", BEAM_CASES)
def test_beam_search_scores_equal_full_forward_rescoring(kind, extra):
    model = eval_model(KINDS[kind]["translation"], extra=extra)
    d = model.decoder.dictionary
    src = random_tokens(d, [6, 4], pad_left=True, generator=torch.Generator().manual_seed(2))
    model.prepare_for_inference_(type("Cfg", (), {"generation": type("G", (), {"beam": 3})()})())
    generator = SequenceGenerator([model], d, beam_size=3, max_len_b=8)
    with torch.no_grad():
        hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)}})
        for i, sentence_hypos in enumerate(hypos):
            for hypo in sentence_hypos:
                tokens = hypo["tokens"].unsqueeze(0)
                prev = torch.cat([tokens.new_full((1, 1), d.eos()), tokens[:, :-1]], dim=1)
                s = src[i][src[i].ne(d.pad())].unsqueeze(0)
                logits, _ = model(s, torch.tensor([s.size(1)]), prev)
                lprobs = model.get_normalized_probs((logits, None), log_probs=True)
                expected = lprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).squeeze(0)
                torch.testing.assert_close(hypo["positional_scores"], expected, rtol=0, atol=1e-4)


REORDER = {"fourier": (torch.float32, 1e-6), "performer": (torch.float32, 1e-6), "gfnet": (torch.float64, 1e-12)}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_reorder_incremental_state_follows_the_new_order(kind):
    """Causal self-attention decodes three positions of a batch, is reordered as beam search
    reorders it (a sentence twice, one dropped), and decodes three more: each of those equals
    decoding the reordered batch from the start."""
    dtype, atol = REORDER[kind]
    m = make(kind, self_attention=True, causal=True).to(dtype)
    T, B = 6, 4
    x = torch.randn(T, B, E, generator=torch.Generator().manual_seed(4), dtype=dtype)
    order = torch.tensor([2, 2, 0, 3])
    reordered, fresh = {}, {}
    with torch.no_grad():
        for t in range(3):
            m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=reordered, need_weights=False)
            xt = x[t:t + 1, order]
            m(xt, xt, xt, incremental_state=fresh, need_weights=False)
        m.reorder_incremental_state(reordered, order)
        for t in range(3, T):
            xt = x[t:t + 1, order]
            a, _ = m(xt, xt, xt, incremental_state=reordered, need_weights=False)
            b, _ = m(xt, xt, xt, incremental_state=fresh, need_weights=False)
            torch.testing.assert_close(a, b, rtol=0, atol=atol)
