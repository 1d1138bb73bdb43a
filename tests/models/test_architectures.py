"""The registered architectures: their sizes, their twins, decoding and the stock command-line tools.

Fast tests build models in-process; the ``slow`` ones run one epoch of the real
``fairseq_cli`` mains (train / generate / validate / eval_lm) on tiny dummy data, as
fairseq's own tests do, and start the stock console scripts in fresh processes.
"""
import os
import re

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from fairseq_helpers import (
    LM_DIMS,
    TRANSLATION_DIMS,
    arch_task,
    build_model,
    eval_lm_main,
    eval_model,
    generate_main,
    hypothesis_scores,
    loading_replaced_by,
    models_as_saved,
    parse_arch,
    plugin_archs,
    random_tokens,
    run_cli,
    token_bleu,
    train_language_model,
    train_translation_model,
    unigram_perplexity,
    validate_main,
    USER_DIR,
)
from fourierformer_fairseq.models import FOURIER_ARCHS, SITES, SOFTMAX_TWINS
from fourierformer_fairseq.modules import FourierMultiheadAttention

TRANSLATION_ARCHS = ["fourierformer_iwslt_de_en", "transformer_iwslt_de_en", "performer_iwslt_de_en", "gfnet_iwslt_de_en"]
LM_ARCHS = [
    "fourierformer_lm_wiki103_small",
    "fourierformer_lm_wiki103_medium",
    "softmax_lm_wiki103_small",
    "softmax_lm_wiki103_medium",
    "fourierformer_lm",  # the dataclass model's own name is an arch too (dataclass defaults)
    "softmax_lm",
    "performer_lm_wiki103_small",
    "performer_lm_wiki103_medium",
    "performer_lm",
    "gfnet_lm_wiki103_small",
    "gfnet_lm_wiki103_medium",
    "gfnet_lm",
]


def fourier_modules(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, FourierMultiheadAttention)}


def attention_modules(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, MultiheadAttention)}


# ============================================================================ definitions


def test_every_registered_arch_is_covered_by_the_cli_tests():
    assert set(plugin_archs()) <= set(TRANSLATION_ARCHS) | set(LM_ARCHS)
    assert set(FOURIER_ARCHS) | set(SOFTMAX_TWINS.values()) <= set(TRANSLATION_ARCHS) | set(LM_ARCHS)


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


def test_no_attention_kinds_options_import_another_kinds():
    """Each kind's file (its config's module) imports no other kind's; what two kinds share
    (the Fourier kernel's power and radius: models/fourier_kernel.py) has a module of its own."""
    import ast
    import importlib

    from fourierformer_fairseq.models.attention_options import AttentionOptions

    def kinds(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from kinds(sub)

    modules = {sub.config_class.__module__ for sub in kinds(AttentionOptions) if hasattr(sub, "config_class")}
    assert {"fourierformer_fairseq.models.fourierformer", "fourierformer_fairseq.models.performer",
            "fourierformer_fairseq.models.gfnet"} <= modules
    short = {m.rsplit(".", 1)[1] for m in modules}
    for module in modules:
        tree = ast.parse(open(importlib.import_module(module).__file__).read())
        imported = {(node.module or "").rsplit(".", 1)[-1] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {a.name.rsplit(".", 1)[-1] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert not imported & (short - {module.rsplit(".", 1)[1]}), (module, imported & short)


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


# ============================================================================ command line


# Language models train for a fixed number of updates (about one epoch of the Markov data at 128
# tokens a batch) and must then score the valid set at under half the unigram perplexity of the same
# data, which no model that ignores its context can reach. Measured (seed 1): 5.67 (FourierFormer)
# and 5.55 (softmax) after 30 updates, unigram 20.79.
LM_TRAINING = ["--max-tokens", "128", "--max-update", "30"]


def lm_threshold(data_dir):
    return unigram_perplexity(os.path.join(data_dir, "train.out"), os.path.join(data_dir, "valid.out")) / 2


@pytest.mark.slow
@pytest.mark.parametrize("arch", TRANSLATION_ARCHS)
def test_translation_arch_trains_validates_and_generates(arch, translation_data, tmp_path, capsys):
    save_dir = str(tmp_path)
    train_translation_model(translation_data, save_dir, arch)
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    assert os.path.exists(checkpoint) and os.path.exists(os.path.join(save_dir, "checkpoint_best.pt"))
    validate_main(translation_data, checkpoint)
    capsys.readouterr()
    generate_main(translation_data, checkpoint, ["--print-alignment"])
    out = capsys.readouterr().out
    # the BLEU it prints is the BLEU of the hypotheses it printed, for every valid sentence
    # (one epoch on 60 pairs learns little: learning is checked by the quickstart, the recipes
    # and the language models; here what generate reports must describe what it generated)
    m = re.search(r"Generate valid with beam=3: BLEU4 = ([0-9.]+), ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) "
                  r"\(BP=([0-9.]+), ratio=[0-9.]+, syslen=(\d+), reflen=(\d+)\)", out)
    assert m, out[-2000:]
    bleu = token_bleu(out)
    assert bleu["sentences"] == bleu["hypotheses"] == 15
    assert (int(m[7]), int(m[8])) == (bleu["syslen"], bleu["reflen"])
    for printed, recomputed in zip(m.groups()[1:5], bleu["precisions"]):
        assert abs(float(printed) - recomputed) <= 0.05 + 1e-9, (m[0], bleu)
    assert abs(float(m[6]) - bleu["bp"]) <= 0.0005 + 1e-9 and abs(float(m[1]) - bleu["bleu"]) <= 0.005 + 1e-9, (m[0], bleu)
    alignments = [line for line in out.splitlines() if line.startswith("A-")]
    assert len(alignments) == 15 and all(re.fullmatch(r"A-\d+\t(\d+-\d+ ?)+", a) for a in alignments)


@pytest.mark.slow
def test_radius_is_learned_and_training_resumes_from_checkpoint_last(translation_data, tmp_path, caplog):
    save_dir = str(tmp_path)
    train_translation_model(translation_data, save_dir, "fourierformer_iwslt_de_en",
                            ["--fourier-radius-shape", "head"])
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    state = torch.load(checkpoint)  # weights_only=True: the plugin's allowlist makes this work
    radii = {k: v for k, v in state["model"].items() if k.endswith(".radius")}
    assert len(radii) == 6  # 2 encoder self, 2 decoder self, 2 cross
    for name, radius in radii.items():
        assert radius.shape == (2, 1) and not torch.allclose(radius, torch.ones_like(radius)), name
    updates = state["optimizer_history"][-1]["num_updates"]
    caplog.clear()
    with caplog.at_level("INFO"):
        train_translation_model(translation_data, save_dir, "fourierformer_iwslt_de_en",
                                ["--fourier-radius-shape", "head"], max_epoch=2)
    # fairseq reports the epoch it resumes into
    assert f"Loaded checkpoint {checkpoint} (epoch 2 @ {updates} updates)" in caplog.text
    resumed = torch.load(checkpoint)
    assert resumed["optimizer_history"][-1]["num_updates"] == 2 * updates
    assert os.path.exists(os.path.join(save_dir, "checkpoint2.pt"))


@pytest.mark.slow
def test_checkpoint_loads_in_fresh_stock_processes(translation_data, tmp_path, capsys):
    """fairseq-generate / -interactive / -validate, new processes, torch.load with weights_only=True;
    the reloaded model scores every test reference as the model did before it was saved."""
    save_dir = str(tmp_path)
    with models_as_saved() as saved:
        train_translation_model(translation_data, save_dir, "fourierformer_iwslt_de_en",
                                ["--fourier-power", "4", "--fourier-radius-shape", "head"])
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    common = ["--user-dir", USER_DIR, "--path", checkpoint, "--source-lang", "in", "--target-lang", "out"]
    scoring = ["--score-reference", "--gen-subset", "test", "--batch-size", "8", "--required-batch-size-multiple", "1"]
    model, cfg = saved[-1]
    capsys.readouterr()
    with loading_replaced_by(model, cfg):  # the in-memory model as it was saved
        generate_main(translation_data, "unused", scoring)
    before = hypothesis_scores(capsys.readouterr().out)
    after = hypothesis_scores(run_cli("fairseq-generate", [translation_data, *common, *scoring]).stdout)
    assert len(before) == 15 and set(after) == set(before)
    for i, (score, text) in before.items():
        # average log2-probability of the reference, printed in full: float32 noise only
        assert after[i][1] == text and abs(after[i][0] - score) < 1e-5, (i, before[i], after[i])
    assert len({round(s, 3) for s, _ in before.values()}) > 1  # scores that depend on the sentence
    # (beam search, BLEU and alignments are checked in process by
    # test_translation_arch_trains_validates_and_generates; here: the stock tools load the checkpoint)
    inter = run_cli("fairseq-interactive", [translation_data, *common, "--beam", "2"], stdin="a b c\nd e\n")
    hyps = [line for line in inter.stdout.splitlines() if line.startswith("H-")]
    assert [h.split("\t")[0] for h in hyps] == ["H-0", "H-1"]
    val = run_cli("fairseq-validate", [translation_data, "--user-dir", USER_DIR, "--path", checkpoint,
                                       "--task", "translation", "--valid-subset", "test", "--max-tokens", "500"])
    assert "valid on 'test' subset" in val.stdout + val.stderr


@pytest.mark.slow
@pytest.mark.parametrize("arch", LM_ARCHS)
def test_language_model_arch_trains_and_evaluates(arch, lm_data, tmp_path):
    save_dir = str(tmp_path)
    train_language_model(lm_data, save_dir, arch, LM_TRAINING, max_epoch=100)
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    plain = eval_lm_main(lm_data, checkpoint)
    windowed = eval_lm_main(lm_data, checkpoint, ["--context-window", "16"])
    for result in (plain, windowed):
        assert float(result["perplexity"]) < lm_threshold(lm_data), (result, lm_threshold(lm_data))
    # the sliding window gives every scored token context, so it cannot do much worse
    assert windowed["loss"] < plain["loss"] + 0.5


@pytest.mark.slow
def test_language_model_with_adaptive_input_and_softmax(lm_data, tmp_path):
    save_dir = str(tmp_path)
    cutoffs = ["--adaptive-input", "--adaptive-input-cutoff", "8,16", "--adaptive-softmax-cutoff", "8,16",
               "--tie-adaptive-weights", "--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp"]
    # adaptive input and softmax learn more slowly: twice the updates (measured: perplexity 11.40 after 30)
    train_language_model(lm_data, save_dir, "fourierformer_lm_wiki103_small",
                         cutoffs + LM_TRAINING + ["--max-update", "60"], max_epoch=100)
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    state = torch.load(checkpoint)
    assert any("adaptive_softmax" in k for k in state["model"])
    ppl = float(eval_lm_main(lm_data, checkpoint)["perplexity"])
    assert ppl < lm_threshold(lm_data), (ppl, lm_threshold(lm_data))


@pytest.mark.slow
def test_language_model_checkpoint_in_fresh_fairseq_eval_lm(lm_data, tmp_path):
    """The checkpoint, reloaded by a fresh fairseq-eval-lm, scores what the model scored before it was saved."""
    save_dir = str(tmp_path)
    with models_as_saved() as saved:
        train_language_model(lm_data, save_dir, "fourierformer_lm_wiki103_small",
                             ["--fourier-radius-shape", "head", *LM_TRAINING], max_epoch=100)
    model, cfg = saved[-1]
    with loading_replaced_by(model, cfg):  # the in-memory model as it was saved
        before = eval_lm_main(lm_data, "unused", ["--context-window", "16"])
    proc = run_cli("fairseq-eval-lm", [lm_data, "--user-dir", USER_DIR, "--path",
                                       os.path.join(save_dir, "checkpoint_last.pt"), "--tokens-per-sample", "32",
                                       "--context-window", "16", "--max-tokens", "500",
                                       "--required-batch-size-multiple", "1"])
    found = re.search(r"Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+)", proc.stdout + proc.stderr)
    assert found
    # printed with 4 decimals: half a unit of rounding, plus float32 noise from other thread counts
    assert abs(float(found.group(1)) - float(before["loss"])) <= 5e-5 + 1e-5, (found.group(0), before)
    assert float(before["perplexity"]) < lm_threshold(lm_data)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["fourierformer_iwslt_de_en", "gfnet_iwslt_de_en", "fourierformer_lm_wiki103_small",
                                  "softmax_lm_wiki103_small"])
def test_checkpoints_record_the_plugin_version(arch, translation_data, lm_data, tmp_path):
    """cfg.model of a checkpoint of each model family of the plugin says which version trained it."""
    import fourierformer_fairseq

    save_dir = str(tmp_path)
    if "_lm_" in arch:
        train_language_model(lm_data, save_dir, arch, ["--max-update", "2"])
    else:
        train_translation_model(translation_data, save_dir, arch, ["--max-update", "2"])
    model_cfg = torch.load(os.path.join(save_dir, "checkpoint_last.pt"))["cfg"]["model"]
    version = model_cfg["fourierformer_version"] if isinstance(model_cfg, dict) else model_cfg.fourierformer_version
    assert version == fourierformer_fairseq.__version__
