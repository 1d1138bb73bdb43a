"""The registered architectures, built in process: their sizes, their twins, their options, decoding.
Their runs through fairseq's command-line tools: tests/runs/test_stock_cli.py."""
import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from fairseq_helpers import (
    LM_DIMS,
    TRANSLATION_DIMS,
    arch_task,
    build_model,
    eval_model,
    parse_arch,
    random_tokens,
)
from fourierformer_fairseq.models import FOURIER_ARCHS, SITES, SOFTMAX_TWINS
from fourierformer_fairseq.modules import FourierMultiheadAttention


def fourier_modules(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, FourierMultiheadAttention)}


def attention_modules(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, MultiheadAttention)}


# ============================================================================ definitions


SPEC = {
    "fourierformer_iwslt_de_en": dict(encoder_layers=6, decoder_layers=6, encoder_embed_dim=512, decoder_embed_dim=512,
                                      encoder_attention_heads=4, decoder_attention_heads=4,
                                      encoder_ffn_embed_dim=1024, decoder_ffn_embed_dim=1024,
                                      fourier_power=2, fourier_qk_norm="rms"),
    "fourierformer_lm_wiki103_small": dict(decoder_layers=16, decoder_embed_dim=128, decoder_attention_heads=8,
                                           decoder_ffn_embed_dim=2048, max_target_positions=256,
                                           fourier_power=4, fourier_qk_norm="rms"),
    "fourierformer_lm_wiki103_medium": dict(decoder_layers=16, decoder_embed_dim=256, decoder_attention_heads=8,
                                            decoder_ffn_embed_dim=2048, max_target_positions=384,
                                            fourier_power=4, fourier_qk_norm="rms"),
}


@pytest.mark.parametrize("arch", FOURIER_ARCHS)
def test_arch_sizes_and_softmax_twin(arch):
    args = parse_arch(arch)
    for key, value in SPEC[arch].items():
        assert getattr(args, key) == value, key
    assert args.fourier_phi == "power" and args.fourier_radius_shape == "scalar" and args.fourier_attention == "all"
    twin = vars(parse_arch(SOFTMAX_TWINS[arch]))
    for key, value in vars(args).items():
        # (fourierformer_version: what the plugin's models record; the stock twin has none)
        if not key.startswith("fourier_") and key not in ("arch", "_name", "fourierformer_version"):
            assert twin.get(key) == value, f"{arch} and {SOFTMAX_TWINS[arch]} differ in {key}"
    if "lm" in arch:  # adaptive input / softmax available by flag, off by default
        assert not args.adaptive_input and args.adaptive_softmax_cutoff is None


@pytest.mark.parametrize("arch", FOURIER_ARCHS)
def test_fourier_model_and_twin_initialise_identically(arch):
    """Same sizes, same parameter names (plus one radius per attention), same initial weights under one seed."""
    dims, task = arch_task(arch)
    torch.manual_seed(3)
    fourier, _ = build_model(arch, dims=dims, task=task)
    torch.manual_seed(3)
    softmax, _ = build_model(SOFTMAX_TWINS[arch], dims=dims, task=task)
    fp, sp = dict(fourier.named_parameters()), dict(softmax.named_parameters())
    radii = {n for n in fp if n.endswith(".radius")}
    assert len(radii) == len(fourier_modules(fourier)) == len(attention_modules(softmax)) > 0
    assert set(fp) - radii == set(sp)
    for name, p in sp.items():
        assert torch.equal(fp[name], p), name
    assert not fourier_modules(softmax)


def test_fourier_attention_sites_and_radius_shape():
    model, _ = build_model("fourierformer_iwslt_de_en",
                           extra=["--fourier-attention", "encoder,cross", "--fourier-radius-shape", "head"])
    kinds = {n: type(m).__name__ for n, m in attention_modules(model).items()}
    assert kinds["encoder.layers.0.self_attn"] == "FourierMultiheadAttention"
    assert kinds["decoder.layers.1.encoder_attn"] == "FourierMultiheadAttention"
    assert kinds["decoder.layers.0.self_attn"] == "MultiheadAttention"
    assert model.encoder.layers[0].self_attn.radius.shape == (2, 1)
    none, _ = build_model("fourierformer_iwslt_de_en", extra=["--fourier-attention", "none"])
    assert not fourier_modules(none)
    lm, _ = build_model("fourierformer_lm_wiki103_small", dims=LM_DIMS, task="language_modeling",
                        extra=["--fourier-power", "2", "--fourier-phi", "abs", "--fourier-radius-init", "0.5",
                               "--fourier-radius-shape", "feature"])
    attn = lm.decoder.layers[0].self_attn
    assert (attn.power, attn.phi, attn.radius.shape) == (2, "abs", (2, 8)) and torch.all(attn.radius == 0.5)


@pytest.mark.parametrize("arch", ["fourierformer_iwslt_de_en", "performer_iwslt_de_en", "gfnet_iwslt_de_en",
                                  "fourierformer_lm_wiki103_small", "performer_lm_wiki103_small",
                                  "gfnet_lm_wiki103_small"])
def test_attention_options_are_read_once_per_model(arch, monkeypatch):
    """build_model reads (and validates) a kind's options once; the encoder, the decoder and every
    layer hold that one object."""
    from fourierformer_fairseq.models.attention_options import AttentionOptions

    reads = []
    real = AttentionOptions.from_args.__func__

    def counted(cls, args, available=None):
        reads.append(cls)
        return real(cls, args, available) if available is not None else real(cls, args)

    monkeypatch.setattr(AttentionOptions, "from_args", classmethod(counted))
    lm = "_lm_" in arch
    model, _ = build_model(arch, dims=LM_DIMS if lm else TRANSLATION_DIMS,
                           task="language_modeling" if lm else "translation")
    assert len(reads) == 1, reads
    holders = [m for m in model.modules() if "attention_options" in vars(m)]
    assert len(holders) == (1 if lm else 2) + len(model.decoder.layers) + (0 if lm else len(model.encoder.layers))
    assert len({id(m.attention_options) for m in holders}) == 1


def test_decoder_layers_mark_their_self_attention_causal(monkeypatch):
    """The decoder layer tells its self-attention that its mask is the future mask: the op then
    runs causal=True with no mask; encoder and encoder-decoder attention are not marked."""
    import fourierformer_fairseq.modules.fourier_multihead_attention as fmha

    model = eval_model()
    layer = model.decoder.layers[0]
    assert layer.self_attn.causal
    assert not layer.encoder_attn.causal
    assert not model.encoder.layers[0].self_attn.causal
    calls = []
    real_attention = fmha.fourier_attention

    def spy(*args, **kw):
        calls.append((kw["attn_mask"], kw["causal"]))
        return real_attention(*args, **kw)

    monkeypatch.setattr(fmha, "fourier_attention", spy)
    d = model.decoder.dictionary
    g = torch.Generator().manual_seed(0)
    src = random_tokens(d, [5, 4], pad_left=True, generator=g)
    prev = random_tokens(d, [6, 6], pad_left=False, generator=g)
    with torch.no_grad():
        model(src, src.ne(d.pad()).sum(1), prev)
    layers = len(model.encoder.layers) + 2 * len(model.decoder.layers)
    assert len(calls) == layers
    assert sum(1 for mask, causal in calls if causal and mask is None) == len(model.decoder.layers)
    assert not any(mask is not None for mask, _ in calls)


@pytest.mark.parametrize("arch,extra,message", [
    ("fourierformer_lm_wiki103_small", ["--fourier-attention", "cross"], "has no decoder encoder-decoder attention"),
    ("fourierformer_iwslt_de_en", ["--fourier-radius-init", "-1"], "must be positive"),
    ("fourierformer_iwslt_de_en", ["--fourier-power", "0"], "positive integer"),
])
def test_bad_options_give_clear_errors(arch, extra, message):
    dims, task = arch_task(arch)
    with pytest.raises(ValueError, match=message):
        build_model(arch, extra=extra, dims=dims, task=task)


@pytest.mark.parametrize("arch", ["fourierformer_iwslt_de_en", "fourierformer_lm_wiki103_small"])
@pytest.mark.parametrize("flag,value", [("--fourier-phi", "cosine"), ("--fourier-qk-norm", "layer"),
                                        ("--fourier-attention", "encoder,attic"), ("--fourier-attention", "cross,encoder")])
def test_bad_choice_is_rejected_by_the_parser(arch, flag, value, capsys):
    """Refused at parse time, before fairseq prints its config, with the values it takes."""
    with pytest.raises(SystemExit):
        parse_arch(arch, flag, value)
    assert f"{flag}: invalid choice: {value!r}" in capsys.readouterr().err


def test_every_spelling_of_the_sites_the_parser_takes_selects_them():
    from fourierformer_fairseq.models.attention_options import site_choices
    from fourierformer_fairseq.models.fourierformer import FourierAttentionOptions

    spellings = [choice.value for choice in site_choices()]
    assert spellings[:2] == ["all", "none"] and len(spellings) == 2 + 7
    for spelling in spellings:
        sites = FourierAttentionOptions.from_args(parse_arch("fourierformer_iwslt_de_en", "--fourier-attention",
                                                             spelling)).sites
        expected = {"all": set(SITES), "none": set()}.get(spelling, set(spelling.split(",")))
        assert sites == expected, spelling


# ============================================================================ decoding


def test_padded_batch_equals_single_sentences():
    model = eval_model()
    d = model.decoder.dictionary
    g = torch.Generator().manual_seed(4)
    src = random_tokens(d, [8, 5, 2], pad_left=True, generator=g)
    tgt_lengths = [6, 3, 5]
    prev = random_tokens(d, tgt_lengths, pad_left=False, generator=g)
    with torch.no_grad():
        batch, extra = model(src, src.ne(d.pad()).sum(1), prev)
        for i, n in enumerate(tgt_lengths):
            s = src[i][src[i].ne(d.pad())].unsqueeze(0)
            single, single_extra = model(s, torch.tensor([s.size(1)]), prev[i: i + 1, :n])
            torch.testing.assert_close(batch[i: i + 1, :n], single, rtol=0, atol=1e-5)
            # the alignment puts zero weight on padded source positions
            pad = src[i].eq(d.pad())
            assert torch.all(extra["attn"][0][i, :, pad] == 0)
            torch.testing.assert_close(extra["attn"][0][i, :n, ~pad], single_extra["attn"][0][0], rtol=0, atol=1e-5)


def test_training_mode_skips_unrequested_attention_weights():
    model = eval_model()
    d = model.decoder.dictionary
    src = random_tokens(d, [5, 4], pad_left=True, generator=torch.Generator().manual_seed(5))
    prev = random_tokens(d, [4, 4], pad_left=False, generator=torch.Generator().manual_seed(6))
    lengths = src.ne(d.pad()).sum(1)
    assert model.eval()(src, lengths, prev)[1]["attn"][0] is not None
    assert model.train()(src, lengths, prev)[1]["attn"][0] is None
    assert model.train()(src, lengths, prev, alignment_layer=1)[1]["attn"][0] is not None
