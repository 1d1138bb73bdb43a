"""The examples/ recipes in their small modes, on tiny generated data (no network, no ../shared).

Unit tests of the Python text pipeline run fast; the end-to-end runs of the shell recipes
(prepare -> train -> evaluate) are marked slow (fairseq's command-line tools, a minute or
two each on a CPU).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile

import pytest

from repo import REPO, load, script

IWSLT = os.path.join(REPO, "examples", "iwslt14")
WIKI = os.path.join(REPO, "examples", "wikitext103")
TEST_SETS = ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012")

# requirements.txt dependencies of the recipes: a missing one is an error, not a skip
import sacremoses  # noqa: E402,F401
import subword_nmt  # noqa: E402,F401
from fairseq_helpers import token_bleu  # noqa: E402


def load_prepare_text():
    spec = importlib.util.spec_from_file_location("prepare_text", os.path.join(IWSLT, "prepare_text.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


P = load_prepare_text()

# --------------------------------------------------------------------------- tiny data
# A word-for-word "language pair": EN[i] translates DE[i], so a translation model can learn the
# test set from the training set, and a score can be compared with baselines that know nothing.
DE = "der die das und ist ein eine nicht mit über für wir sie haben große Welt Straße Häuser Menschen Zeit heute".split()
EN = "the a this and is one an not with about for we they have big world street houses people time today".split()
assert len(DE) == len(EN)


def pair(rng, n=None):
    """A German sentence and its word-for-word English translation, with Moses-relevant extras."""
    n = n or rng.randint(3, 12)
    idx = [rng.randrange(len(DE)) for _ in range(n)]
    de, en = [DE[i] for i in idx], [EN[i] for i in idx]
    de[0], en[0] = de[0].capitalize(), en[0].capitalize()
    de, en = " ".join(de), " ".join(en)
    extra, j = rng.random(), rng.randrange(len(DE))
    if extra < 0.2:  # quotes, on both sides
        de, en = de + ', "' + DE[j] + '"', en + ', "' + EN[j] + '"'
    elif extra < 0.3:  # Moses escapes and numbers, German only (a copied source gains nothing)
        de = de + " & " + DE[j] + " (5,300)"
    elif extra < 0.4:
        de, en = de + " usw", en + " etc"
    end = rng.choice([".", "?", "!", "..."])
    return de + end, en + end


def write_fake_iwslt(folder: str, n_train: int = 230, n_seg: int = 6, seed: int = 0) -> dict:
    """A fake de-en archive folder: train.tags.de-en.{de,en} and the five XML dev/test sets."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    de_lines, en_lines = [], []
    for talk in range(n_train // 10):
        head = [("<url>http://www.ted.com/talks/x%d.html</url>" % talk,) * 2,
                ("<keywords>talks, test</keywords>",) * 2,
                ("<speaker>Jemand</speaker>", "<speaker>Someone</speaker>"),
                ("<talkid>%d</talkid>" % talk,) * 2,
                ("<title>Titel %d</title>" % talk, "<title>Title %d</title>" % talk),
                ("<description>Über %d.</description>" % talk, "<description>About %d.</description>" % talk)]
        for d, e in head:
            de_lines.append(d)
            en_lines.append(e)
        for _ in range(10):
            d, e = pair(rng)
            de_lines.append(d)
            en_lines.append(e)
    # one pair that clean-corpus must drop (ratio > 1.5) and one too long (> 175 tokens)
    de_lines.append("Ja .")
    en_lines.append("yes yes yes yes yes yes yes yes")
    de_lines.append(" ".join(["Wort"] * 180))
    en_lines.append(" ".join(["word"] * 180))
    for lang, lines in (("de", de_lines), ("en", en_lines)):
        with open(os.path.join(folder, f"train.tags.de-en.{lang}"), "w", encoding="utf-8") as fh:
            fh.writelines(x + "\n" for x in lines)
    counts = {}
    for name in TEST_SETS:
        pairs = [pair(rng) for _ in range(n_seg)]
        # a typographic apostrophe, which the canonical pipeline maps to ' in dev/test only
        pairs[0] = ("Das ist’s .", "That’s it .")
        for li, lang in enumerate(("de", "en")):
            body = "\n".join(f'<seg id="{i + 1}"> {p[li]} </seg>' for i, p in enumerate(pairs))
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="x" srclang="german">\n'
                   f'<doc docid="1" genre="lectures">\n<url>http://x</url>\n<talkid>1</talkid>\n'
                   f'<title>T</title>\n{body}\n</doc>\n</srcset>\n</mteval>\n')
            with open(os.path.join(folder, f"IWSLT14.{name}.de-en.{lang}.xml"), "w", encoding="utf-8") as fh:
                fh.write(xml)
        counts[name] = n_seg
    return {"train_tag_pairs": len(de_lines), "test_counts": counts}


def make_tgz(folder: str, out: str) -> str:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname="de-en")
    return out


def run(cmd, env=None, **kw):
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHON", sys.executable)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)


def lines(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read().split("\n")[:-1]


# --------------------------------------------------------------------------- unit tests
def test_tokenize_matches_moses_head_rules():
    # tokenizer.perl (current Moses): the period of the line's last word is always split off
    assert P.tokenize_line("en", "I moved to the U.S.") == "I moved to the U.S ."
    assert P.tokenize_line("de", "Das kostet 70.") == "Das kostet 70 ."
    assert P.tokenize_line("de", "Dr. Müller kam.") == "Dr. Müller kam ."
    # HTML escaping, as tokenizer.perl without -no-escape
    assert P.tokenize_line("en", 'He said "a & b" [x] |') == "He said &quot; a &amp; b &quot; &#91; x &#93; &#124;"
    assert P.tokenize_line("en", "don't") == "don &apos;t"
    assert P.tokenize_line("en", "   ") == "   "


def test_clean_corpus_like_clean_corpus_n():
    src = ["a b c", "", "a  b ", "x " * 200, "a", "one two three four"]
    tgt = ["a b c", "x", "a b", "y", "a b c d", "eins zwei drei vier"]
    s, t = P.clean_corpus(src, tgt, 1, 175, 1.5)
    assert s == ["a b c", "a b", "one two three four"]
    assert t == ["a b c", "a b", "eins zwei drei vier"]


def test_xml_and_train_tags(tmp_path):
    info = write_fake_iwslt(str(tmp_path / "de-en"), n_train=20)
    segs = P.xml_segments(str(tmp_path / "de-en" / "IWSLT14.TED.dev2010.de-en.en.xml"))
    assert len(segs) == 6 and segs[0] == "That's it ." and not segs[1].startswith(" ")
    tags = P.train_tags_lines(str(tmp_path / "de-en" / "train.tags.de-en.de"))
    assert not any("<url>" in x or "<talkid>" in x or "<keywords>" in x for x in tags)
    assert "Titel 0" in tags and "<speaker>Jemand</speaker>" in tags  # as the canonical grep/sed
    assert info["train_tag_pairs"] - len(tags) == 3 * (20 // 10)


def test_prepare_text_iwslt_splits(tmp_path):
    write_fake_iwslt(str(tmp_path / "orig" / "de-en"), n_train=230)
    out = tmp_path / "text"
    assert P.main(["--corpus", "iwslt14", "--orig", str(tmp_path / "orig"), "--out", str(out),
                   "--bpe-merges", "50", "--workers", "1"]) == 0
    stats = json.load(open(out / "stats.json"))
    tr, va = lines(out / "tmp" / "train.de"), lines(out / "tmp" / "valid.de")
    # every 23rd cleaned pair goes to valid
    assert len(va) == (len(tr) + len(va)) // 23
    assert stats["test.de"] == stats["test.en"] == 5 * 6
    test = lines(out / "tmp" / "test.en")
    assert test[0] == "that &apos;s it ." and all(x == x.lower() for x in test)
    # canonical order: dev2010, TEDX.dev2012, tst2010, tst2011, tst2012
    dev = lines(out / "tmp" / "IWSLT14.TED.dev2010.de-en.en")
    tedx = lines(out / "tmp" / "IWSLT14.TEDX.dev2012.de-en.en")
    assert test[:6] == dev and test[6:12] == tedx
    assert len(lines(out / "raw" / "test.en")) == 30 and lines(out / "raw" / "test.en")[0] == "That’s it ."
    assert lines(out / "code")[0].startswith("#version")
    bpe = lines(out / "train.en")
    assert len(bpe) == len(lines(out / "tmp" / "train.en"))
    assert any("@@" in x for x in bpe)


# --------------------------------------------------------------------------- shell recipes
@pytest.mark.parametrize("script", ["iwslt14/prepare.sh", "iwslt14/train.sh", "iwslt14/evaluate.sh",
                                    "wikitext103/prepare.sh", "wikitext103/train.sh", "wikitext103/evaluate.sh",
                                    "cpu_scale/run.sh", "full_size/compare.sh"])
def test_help(script):
    r = run(["bash", os.path.join(REPO, "examples", script), "--help"])
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout


def test_unknown_option_is_an_error():
    r = run(["bash", os.path.join(IWSLT, "prepare.sh"), "--frobnicate"])
    assert r.returncode != 0 and "unknown option" in r.stderr


def test_every_fourier_option_reaches_meta_and_the_run_name(tmp_path):
    """write_meta / fourier_suffix (examples/lib.sh) and make_tables.py list no options: each
    field of FourierAttentionConfig given on the command line lands in meta.json, in the run's
    name and in the setting make_tables.py reads back."""
    import dataclasses

    from fourierformer_fairseq.models.fourierformer import FourierAttentionConfig

    make_tables = load("scripts/analysis/tables/make_tables.py")

    names = [f.name[len("fourier_"):] for f in dataclasses.fields(FourierAttentionConfig)]
    extra = ["--lr", "3"]
    for i, n in enumerate(names):
        extra += ["--fourier-" + n.replace("_", "-")] + ([] if n == "paper_exact" else [f"v{i}"])
    meta = tmp_path / "meta.json"
    script = 'source "$1"; shift; write_meta "$@"; fourier_suffix "${@:4}"'
    r = run(["bash", "-c", script, "x", os.path.join(REPO, "examples", "lib.sh"), str(meta), "task=wikitext103",
             "model=fourier", "--"] + extra)
    assert r.returncode == 0, r.stderr
    got = json.load(open(meta))
    assert got["extra_args"] == extra and got["task"] == "wikitext103"
    want = {n: 1 if n == "paper_exact" else f"v{i}" for i, n in enumerate(names)}
    assert got["fourier"] == want
    for n, v in want.items():
        assert (n if v == 1 else f"{n}{v}") in r.stdout, n
    # read back: every option that changes the model is part of the run's setting
    run_ = make_tables.read_run(str(tmp_path))
    assert set(run_["fourier"]) == set(names) - set(make_tables.NOT_SETTINGS) and "log_interval" in names
    assert set(make_tables.declared_defaults()) == set(names)


def test_the_run_name_suffix_has_one_parser():
    """examples/lib.sh's fourier_suffix prints what fairseq_runs.run_name_suffix (options_given's reading
    of the arguments) makes of them, and parses no --fourier-* option itself."""
    import re

    from fourierformer_fairseq.fairseq_runs import run_name_suffix

    lib = os.path.join(REPO, "examples", "lib.sh")
    assert not re.search(r"^\s*--fourier-\*[^)\n]*\)", open(lib).read(), re.M), "lib.sh matches --fourier-* itself"
    for extra in ([], ["--lr", "3"], ["--fourier-phi", "abs", "--fourier-paper-exact"],
                  ["--fourier-radius-init=1.0", "--max-tokens", "9", "--fourier-power", "-1", "--fourier-published"]):
        r = run(["bash", "-c", 'source "$1"; shift; fourier_suffix "$@"', "x", lib, *extra])
        assert r.returncode == 0, r.stderr
        assert r.stdout == run_name_suffix(extra) + "\n", extra
    assert run_name_suffix(["--fourier-phi", "abs", "--fourier-paper-exact"]) == "_phiabs_paper_exact"


def test_prepare_missing_raw_is_a_clear_error(tmp_path):
    r = run(["bash", os.path.join(IWSLT, "prepare.sh"), "--raw", str(tmp_path / "nope.tgz"), "--out", str(tmp_path / "o")])
    assert r.returncode != 0 and "does not exist" in r.stderr
    # the folder form of --raw is read where it is, by the text pipeline that reads the
    # extracted archive in the recipe's pipeline below: a folder without the corpus is named
    (tmp_path / "empty").mkdir()
    r = run(["bash", os.path.join(IWSLT, "prepare.sh"), "--raw", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    assert "using local folder" in r.stderr and "extracting" not in r.stderr
    assert r.returncode != 0 and f"no train.tags.de-en.* under {tmp_path / 'empty'}" in r.stderr


def test_prepare_checksum_mismatch_fails(tmp_path):
    write_fake_iwslt(str(tmp_path / "de-en"), n_train=20)
    tgz = make_tgz(str(tmp_path / "de-en"), str(tmp_path / "de-en.tgz"))
    r = run(["bash", os.path.join(IWSLT, "prepare.sh"), "--raw", tgz, "--out", str(tmp_path / "o"), "--md5", "0" * 32])
    assert r.returncode != 0 and "MD5 mismatch" in r.stderr


@pytest.mark.skipif(not (shutil.which("curl") or shutil.which("wget")), reason="needs curl or wget")
def test_prepare_download_path(tmp_path):
    """The online path, with a file:// URL: download, checksum, extraction; a second call reuses
    the file and still checks its checksum."""
    write_fake_iwslt(str(tmp_path / "src" / "de-en"), n_train=60)
    tgz = make_tgz(str(tmp_path / "src" / "de-en"), str(tmp_path / "de-en.tgz"))
    md5 = hashlib.md5(open(tgz, "rb").read()).hexdigest()
    env = dict(os.environ, IWSLT14_URL="file://" + tgz, PYTHON=sys.executable)
    out = tmp_path / "data"
    args = ["--small", "--bpe-merges", "30", "--workers", "1"]
    cmd = ["bash", os.path.join(IWSLT, "prepare.sh"), "--out", str(out), "--md5", md5] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "downloading file://" in r.stderr and "checksum OK" in r.stderr
    assert (out / "de-en.tgz").exists() and (out / "dict.en.txt").exists()
    # a second call reuses the file, and checks it again: a wrong checksum stops the pipeline
    r = subprocess.run(["bash", os.path.join(IWSLT, "prepare.sh"), "--out", str(out), "--md5", "f" * 32] + args,
                       capture_output=True, text=True, env=env)
    assert "already downloaded" in r.stderr and "downloading" not in r.stderr, r.stderr[-3000:]
    assert r.returncode != 0 and "MD5 mismatch" in r.stderr


def corpus_bleu(hyps, refs):
    import sacrebleu
    return sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score


def baseline_bleus(text_dir):
    """sacreBLEU of two systems that translate nothing: the source copied, and the target
    training set's most frequent words, as many as the source has."""
    import collections

    src, ref = lines(text_dir / "raw" / "test.de"), lines(text_dir / "raw" / "test.en")
    counts = collections.Counter(w for x in lines(text_dir / "tmp" / "train.en") for w in x.split())
    top = [w for w, _ in counts.most_common()]
    unigram = [" ".join(top[: len(x.split())]) for x in src]
    return {"copy": corpus_bleu(src, ref), "unigram": corpus_bleu(unigram, ref)}


def assert_average_of(avg_path, inputs):
    """checkpoint_avgN.pt holds the element-wise mean of its inputs' parameters."""
    import torch

    states = [torch.load(p, map_location="cpu", weights_only=False)["model"] for p in inputs]
    avg = torch.load(avg_path, map_location="cpu", weights_only=False)["model"]
    assert set(avg) == set(states[0])
    for name, value in avg.items():
        if value.is_floating_point():
            mean = sum(s[name].double() for s in states) / len(states)
            torch.testing.assert_close(value.double(), mean, rtol=1e-6, atol=1e-7, msg=name)


# a few hundred updates that a tiny model needs to learn the word-for-word pair (the
# recipe's small mode stops after 3 epochs, which checks the pipeline but learns nothing)
LEARN_MT = ["--lr", "0.01", "--", "--max-epoch", "1000", "--max-update", "400", "--max-tokens", "512",
            "--dropout", "0"]


@pytest.fixture(scope="module")
def recipe_base(tmp_path_factory):
    """One folder in the layout examples/reproduce.sh uses (data-bin/, runs/), holding the
    translation and the language-model pipelines below; the reproduce test reuses both."""
    return tmp_path_factory.mktemp("recipes")


@pytest.fixture(scope="module")
def iwslt_runs(recipe_base):
    """prepare (offline, an archive with a verified checksum) -> train both twins -> evaluate:
    the recipe's pipeline, run once for the tests below."""
    base = recipe_base
    write_fake_iwslt(str(base / "src" / "de-en"), n_train=400)
    tgz = make_tgz(str(base / "src" / "de-en"), str(base / "de-en.tgz"))
    md5 = hashlib.md5(open(tgz, "rb").read()).hexdigest()
    data = base / "data-bin" / "iwslt14.tokenized.de-en"
    # 300 merges: every word of the pair stays whole
    prepared = run(["bash", os.path.join(IWSLT, "prepare.sh"), "--raw", tgz, "--md5", md5, "--out", str(data),
                    "--small", "--bpe-merges", "300", "--workers", "1"])
    out = {"base": base, "data": data, "prepare": prepared, "runs": base / "runs" / "iwslt14", "steps": {}}
    if prepared.returncode != 0:
        return out
    for m in ("softmax", "fourier"):
        trained = run(["bash", os.path.join(IWSLT, "train.sh"), "--model", m, "--small", "--seeds", "3",
                       "--data", str(data), "--runs", str(out["runs"])] + LEARN_MT)
        evaluated = trained.returncode == 0 and run(["bash", os.path.join(IWSLT, "evaluate.sh"), "--small", "--data",
                                                     str(data), str(out["runs"] / f"{m}_seed3")])
        out["steps"][m] = (trained, evaluated)
    return out


def test_iwslt_small_end_to_end(iwslt_runs, tmp_path):
    """prepare -> train (both twins) -> evaluate -> tables.

    The scores are recomputed from the files the recipe wrote and must beat, by 5 BLEU, both a
    copy of the source and the target's most frequent words."""
    r = iwslt_runs["prepare"]
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checksum OK" in r.stderr
    data = iwslt_runs["data"]
    for f in ("dict.de.txt", "dict.en.txt", "train.de-en.de.bin", "valid.de-en.en.idx", "test.de-en.en.bin"):
        assert (data / f).exists(), f
    baselines = baseline_bleus(data / "text")
    refs = lines(data / "text" / "raw" / "test.en")

    models = ["softmax", "fourier"]
    runs = iwslt_runs["runs"]
    for m in models:
        trained, evaluated = iwslt_runs["steps"][m]
        assert trained.returncode == 0, trained.stderr[-3000:]
        run_dir = runs / f"{m}_seed3"
        ck = run_dir / "checkpoints"
        assert (ck / "checkpoint_last.pt").exists()
        meta = json.load(open(run_dir / "meta.json"))
        assert meta["seed"] == 3 and meta["task"] == "iwslt14"
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        res = json.load(open(run_dir / "results-test.json"))
        assert res["sentences"] == len(refs) == 5 * 6  # every test sentence translated, in order
        hyps = lines(run_dir / "generate-test.detok.en")
        assert len(hyps) == len(refs)
        assert res["sacrebleu"] == pytest.approx(corpus_bleu(hyps, refs), abs=0.006)
        assert res["sacrebleu"] > max(baselines.values()) + 5, (m, res, baselines)
        # the tokenised BLEU is fairseq-generate's BLEU4 of the hypotheses it wrote (recomputed)
        recomputed = token_bleu((run_dir / "generate-test.txt").read_text(encoding="utf-8"))
        assert recomputed["sentences"] == recomputed["hypotheses"] == len(refs)
        assert res["bleu_tok"] == pytest.approx(recomputed["bleu"], abs=0.006), (m, res, recomputed)
        assert res["sacrebleu_signature"].startswith("nrefs:1|case:lc")
        assert res["sacrebleu_references"].startswith("raw references")
        epochs = sorted(int(p.name[len("checkpoint"):-3]) for p in ck.glob("checkpoint[0-9]*.pt"))
        assert_average_of(ck / "checkpoint_avg2.pt", [ck / f"checkpoint{e}.pt" for e in epochs[-2:]])
    r = run([sys.executable, script("scripts/analysis/tables/make_tables.py"), "--runs", str(runs)])
    assert r.returncode == 0, r.stderr
    assert "Table 5" in r.stdout and "34.42" in r.stdout
    for m in models:  # the table shows what was measured
        res = json.load(open(runs / f"{m}_seed3" / "results-test.json"))
        assert f"{res['bleu_tok']:.2f}" in r.stdout and f"{res['sacrebleu']:.2f}" in r.stdout


def write_fake_wiki(folder: str, n_train=400, n_valid=40, seed=0):
    """WikiText-like lines in which each word is followed, nine times in ten, by one of two
    successors: a language model can learn what a unigram model cannot."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(60)] + ["the", "of", ",", ".", "<unk>", "@-@"]
    n = len(words)
    successors = [((i * 7 + 3) % n, (i * 13 + 5) % n) for i in range(n)]  # two permutations
    os.makedirs(folder, exist_ok=True)
    for split, count in (("train", n_train), ("valid", n_valid)):
        with open(os.path.join(folder, f"wiki.{split}.tokens"), "w") as fh:
            for i in range(count):
                if i % 15 == 0:
                    fh.write(f" = Heading {i} = \n")
                    continue
                ids = [rng.randrange(n)]
                for _ in range(rng.randint(5, 30) - 1):
                    ids.append(rng.choice(successors[ids[-1]]) if rng.random() < 0.9 else rng.randrange(n))
                fh.write(" " + " ".join(words[j] for j in ids) + " \n")


def unigram_perplexity(folder) -> float:
    """Perplexity on valid of add-one unigram frequencies from train (a line ends in </s>)."""
    import collections
    import math

    def tokens(split):
        return [t for x in lines(os.path.join(folder, f"wiki.{split}.tokens")) for t in x.split() + ["</s>"]]

    train, valid = tokens("train"), tokens("valid")
    counts = collections.Counter(train)
    total, types = len(train), len(counts) + 1
    return math.exp(-sum(math.log((counts[t] + 1) / (total + types)) for t in valid) / len(valid))


# what the small language model needs to learn the successor structure of write_fake_wiki (the
# recipe's small mode stops after 40 updates, which checks the pipeline but learns little)
LEARN_LM = ["--lr", "0.003", "--", "--max-update", "300"]


@pytest.fixture(scope="module")
def wiki_data(recipe_base):
    """The WikiText recipe's prepare step on write_fake_wiki's corpus (--small)."""
    raw = recipe_base / "wiki-raw"
    write_fake_wiki(str(raw))
    data = recipe_base / "data-bin" / "wikitext-103"
    prepared = run(["bash", os.path.join(WIKI, "prepare.sh"), "--raw", str(raw), "--out", str(data), "--small"])
    return {"raw": raw, "data": data, "prepare": prepared}


@pytest.fixture(scope="module")
def wiki_runs(recipe_base, wiki_data):
    """prepare -> train both twins -> evaluate: the WikiText recipe's pipeline, run once for
    the tests below, in the run names examples/reproduce.sh gives the small models."""
    raw, data, prepared = wiki_data["raw"], wiki_data["data"], wiki_data["prepare"]
    out = {"raw": raw, "data": data, "prepare": prepared, "runs": recipe_base / "runs" / "wikitext103", "steps": {}}
    if prepared.returncode != 0:
        return out
    for m in ("softmax", "fourier"):
        trained = run(["bash", os.path.join(WIKI, "train.sh"), "--model", m, "--size", "small", "--small",
                       "--seeds", "3", "--data", str(data), "--runs", str(out["runs"])] + LEARN_LM)
        evaluated = trained.returncode == 0 and run(["bash", os.path.join(WIKI, "evaluate.sh"), "--small", "--data",
                                                     str(data), str(out["runs"] / f"{m}_small_seed3")])
        out["steps"][m] = (trained, evaluated)
    return out


def test_wikitext_small_end_to_end(wiki_runs):
    """prepare -> train (both twins, 300 updates) -> evaluate -> tables; each model's valid
    perplexity must be under a quarter of the unigram perplexity of the same data."""
    r = wiki_runs["prepare"]
    assert r.returncode == 0, r.stderr[-3000:]
    data = wiki_runs["data"]
    assert (data / "dict.txt").exists() and (data / "valid.bin").exists() and not (data / "test.bin").exists()
    assert "skipping the test split" in r.stderr
    unigram = unigram_perplexity(wiki_runs["raw"])

    models = ["softmax", "fourier"]
    runs = wiki_runs["runs"]
    for m in models:
        trained, evaluated = wiki_runs["steps"][m]
        assert trained.returncode == 0, trained.stderr[-3000:]
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        run_dir = runs / f"{m}_small_seed3"
        assert json.load(open(run_dir / "meta.json"))["seed"] == 3
        res = json.load(open(run_dir / "results-lm.json"))
        assert res["context"] == 32 and "test_ppl" not in res
        assert res["valid_ppl"] == pytest.approx(2 ** res["valid_loss_base2"], rel=2e-3)
        assert res["valid_ppl"] < unigram / 4, (m, res["valid_ppl"], unigram)
    r = run([sys.executable, script("scripts/analysis/tables/make_tables.py"), "--runs", str(runs)])
    assert r.returncode == 0, r.stderr
    assert "Table 1" in r.stdout and "softmax small" in r.stdout
    for m in models:  # the table shows what was measured
        res = json.load(open(runs / f"{m}_small_seed3" / "results-lm.json"))
        assert f"{res['valid_ppl']:.2f}" in r.stdout


def test_reproduce_small_tables_offline(iwslt_runs, wiki_runs, tmp_path):
    """examples/reproduce.sh, the one command per table, in small mode from local raw files,
    over the pipelines above: it must reuse their prepared data and evaluated runs (table 5:
    the translation twins; table 6: the small language models) and add what they lack (head
    redundancy with its PNG). The distances of table 6 must be real: with every head's query
    and key projections copied from head 0, head_redundancy.py must find them zero."""
    root = iwslt_runs["base"]
    runs = root / "runs"
    cmd = ["bash", os.path.join(REPO, "examples", "reproduce.sh"), "--small", "--seeds", "3",
           "--iwslt-raw", str(root / "src"), "--wikitext-raw", str(wiki_runs["raw"]),
           "--data-root", str(root / "data-bin"), "--runs", str(runs)]
    r = run(cmd + ["table5", "table6"])
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stderr.count("already evaluated") == 4  # two translation runs, two language models
    table5 = (runs / "table5.md").read_text()
    assert "Table 5" in table5 and "34.42" in table5 and "34.68" in table5
    table6 = (runs / "table6.md").read_text()
    # the paper's Fourier row is the published attention (trained here, in small mode), the defaults beside it
    assert "Table 6" in table6 and "| FourierFormer small (published attention) |" in table6
    assert "7.45 ± 2.50" in table6 and "6.20 ± 2.30" in table6
    # every number measured reaches its table (the scores themselves are checked in the tests above)
    import torch

    for model in ("softmax", "fourier"):
        res = json.load(open(runs / "iwslt14" / f"{model}_seed3" / "results-test.json"))
        assert res["sentences"] == 5 * 6
        assert f"{res['bleu_tok']:.2f}" in table5 and f"{res['sacrebleu']:.2f}" in table5
        hr = json.load(open(runs / f"head_redundancy_{model}_small.json"))
        assert hr["site"] == "decoder" and hr["layers"] == 2 and hr["heads"] == 2  # the small mode's model
        assert hr["mean"] > 1e-3 and hr["var"] >= 0 and all(layer["pairs"] >= 1 for layer in hr["per_layer"])
        row = {"softmax": "softmax small", "fourier": "FourierFormer small (defaults)"}[model]
        assert f"| {row} | {hr['mean']:.4g} | {hr['var']:.4g} |" in table6
        assert (runs / f"attention_maps_{model}_small.png").stat().st_size > 1000

        ck = runs / "wikitext103" / f"{model}_small_seed3" / "checkpoints" / "checkpoint_best.pt"
        state = torch.load(ck, map_location="cpu", weights_only=False)
        weights = state["model"]
        for layer in range(hr["layers"]):
            for proj in ("q_proj", "k_proj"):
                for t in ("weight", "bias"):
                    w = weights[f"decoder.layers.{layer}.self_attn.{proj}.{t}"]
                    hd = w.shape[0] // hr["heads"]
                    for h in range(1, hr["heads"]):
                        w[h * hd:(h + 1) * hd] = w[:hd]
        twin = tmp_path / f"{model}_twin_heads.pt"
        torch.save(state, twin)
        out = tmp_path / f"{model}_twin_heads.json"
        r = run([sys.executable, script("scripts/analysis/tables/head_redundancy.py"), "--small", "--cpu",
                 "--checkpoint", str(twin), "--data", str(wiki_runs["data"]), "--out", str(out), "--label", model])
        assert r.returncode == 0, r.stderr[-3000:]
        twin_hr = json.load(open(out))
        assert [x["pairs"] for x in twin_hr["per_layer"]] == [x["pairs"] for x in hr["per_layer"]]
        assert twin_hr["mean"] < 1e-5 * hr["mean"], (model, twin_hr["mean"], hr["mean"])


def test_reproduce_table_survives_a_diverging_row(wiki_data, tmp_path):
    """A row whose training goes NaN (x^3 at a learning rate of 1e30, through a fairseq-train on PATH that
    adds it to that row's command) is recorded as not converged, with the update it stopped at, and the
    table goes on: the row after it (|x|) trains and is evaluated, and the table says "not converge"
    beside the paper's "not converge". The rows before are evaluated runs reproduce.sh reuses."""
    from fourierformer_fairseq.fairseq_runs import options_given

    table_runs = load_paper_runs().table_runs
    assert wiki_data["prepare"].returncode == 0, wiki_data["prepare"].stderr[-3000:]
    runs = tmp_path / "runs"
    trained = ("published_small_power3", "published_small_phiabs")
    for i, (name, model, size, extra, *_) in enumerate(table_runs("table7")["runs"]):
        if name in trained:
            continue
        folder = runs / "wikitext103" / f"{name}_seed1"
        folder.mkdir(parents=True)
        meta = {"task": "wikitext103", "model": model, "size": size, "seed": 1, "protocol": "published", "name": name,
                "data": str(wiki_data["data"]), "extra_args": list(extra), "fourier": options_given(list(extra))}
        (folder / "meta.json").write_text(json.dumps(meta))
        (folder / "results-lm.json").write_text(json.dumps({"valid_ppl": 40.0 + i}))
    stubs = tmp_path / "bin"
    stubs.mkdir()
    stub = stubs / "fairseq-train"
    stub.write_text("#!/usr/bin/env bash\n"
                    'if [[ " $* " == *" --fourier-power 3 "* ]]; then set -- "$@" --lr 1e30; fi\n'
                    f'exec {shutil.which("fairseq-train")} "$@"\n')
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}")
    r = run(["bash", os.path.join(REPO, "examples", "reproduce.sh"), "--small", "--seeds", "1",
             "--data-root", str(wiki_data["data"].parent), "--runs", str(runs), "table7"], env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    diverged = runs / "wikitext103" / "published_small_power3_seed1"
    record = json.loads((diverged / "not_converged.json").read_text())
    assert "gradients are Nan/Inf" in record["error"] and record["source"] == "checkpoints/crash.pt"
    assert 1 <= record["stopped_at_update"] <= 40 and not (diverged / "results-lm.json").exists()
    after = json.loads((runs / "wikitext103" / "published_small_phiabs_seed1" / "results-lm.json").read_text())
    assert after["valid_ppl"] > 0
    table = (runs / "table7.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| phi x^3 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    said = f"not converge (stopped at update {record['stopped_at_update']:,})"
    assert cells[2] == cells[3] == said and cells[5] == cells[6] == "not converge", row
    assert f"| phi |x| | paper | {after['valid_ppl']:.2f} |" in table
    assert "without evaluation results" not in table


def load_paper_runs():
    """examples/paper_runs.py, the paper tables' runs and their cost, from its file."""
    spec = importlib.util.spec_from_file_location("paper_runs", os.path.join(REPO, "examples", "paper_runs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- full-size comparison
FULL = os.path.join(REPO, "examples", "full_size")


def load_full_size_summarize():
    spec = importlib.util.spec_from_file_location("full_size_summarize", os.path.join(FULL, "summarize.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fairseq_json_line(kind, record):
    """A line as fairseq-train --log-format json writes it: values as strings, a metric that was
    not logged in the interval as null."""
    values = {k: (None if v is None else str(v)) for k, v in record.items()}
    return f"2026-01-01 00:00:00 | INFO | {kind} | {json.dumps(values)}\n"


def test_fairseq_log_records_reads_the_tagged_json_lines_only():
    """The shared reader of training logs: the tag and the JSON of train_inner, train and valid
    lines, in order, nulls kept; other lines (progress text, a broken JSON, another logger's
    JSON) skipped."""
    from fourierformer_fairseq.fairseq_runs import fairseq_log_records

    lines = [
        "2026-01-01 00:00:00 | INFO | fairseq_cli.train | begin training",
        fairseq_json_line("train_inner", {"num_updates": 10, "loss": 9.5, "radius_enc0": None}),
        '2026-01-01 00:00:01 | INFO | train_inner | {"num_updates": "20", "loss": ',
        fairseq_json_line("valid", {"valid_loss": 7.25, "valid_num_updates": 20}),
        fairseq_json_line("train", {"train_loss": 9.0}),
        '2026-01-01 00:00:02 | INFO | fairseq.checkpoint_utils | {"saved": "checkpoint_1_20.pt"}',
    ]
    got = list(fairseq_log_records(lines))
    assert got == [("train_inner", {"num_updates": "10", "loss": "9.5", "radius_enc0": None}),
                   ("valid", {"valid_loss": "7.25", "valid_num_updates": "20"}),
                   ("train", {"train_loss": "9.0"})]


def test_full_size_summary_reads_logs_hypotheses_and_gaps(tmp_path, capsys):
    """summarize.py on two hand-written runs: the update a run reached (training or validation),
    validation by update, the radius and null key of the last interval that logged them (not the
    null of a later one), error lines, the median rate of the later two thirds, and BLEU from the
    hypotheses (identical to the references: 100; another sentence: below 50)."""
    refs = ["a man rides a horse .", "two dogs play in the snow .", "a woman is reading a book ."]
    (tmp_path / "refs.en").write_text("\n".join(refs) + "\n")
    soft = tmp_path / "mt_softmax"
    pub = tmp_path / "mt_published"
    soft.mkdir()
    pub.mkdir()
    with open(soft / "train.log", "w") as fh:
        for u, ups in ((10, 2.0), (20, 4.0), (30, 5.0)):
            fh.write(fairseq_json_line("train_inner", {"num_updates": u, "loss": 9 - u / 10, "gnorm": u / 10, "ups": ups}))
        fh.write(fairseq_json_line("valid", {"valid_nll_loss": 7.5, "valid_num_updates": 10}))
        fh.write(fairseq_json_line("valid", {"valid_nll_loss": 6.25, "valid_num_updates": 20}))
    with open(pub / "train.log", "w") as fh:
        fh.write(fairseq_json_line("train_inner", {"num_updates": 10, "loss": 8.5, "gnorm": 2.0, "ups": 1.0,
                                                   "radius_enc0": 0.99, "nullkey_enc0": 0.75}))
        fh.write(fairseq_json_line("train_inner", {"num_updates": 20, "loss": 8.0, "gnorm": 3.0, "ups": 1.0,
                                                   "radius_enc0": None, "nullkey_enc0": None}))
        fh.write(fairseq_json_line("valid", {"valid_nll_loss": 7.0, "valid_num_updates": 10}))
        fh.write(fairseq_json_line("valid", {"valid_nll_loss": 6.5, "valid_num_updates": 25}))
        fh.write("FloatingPointError: Minimum loss scale reached (0.0001).\n")
    (tmp_path / "mt_common_update").write_text("20\n")
    with open(soft / "gen_20.txt", "w") as fh:
        for i in (2, 0, 1):  # fairseq writes hypotheses in batch order
            fh.write(f"S-{i}\tsource\nH-{i}\t-0.1\t{refs[i]}\n")
    with open(pub / "gen_20.txt", "w") as fh:
        for i in range(3):
            fh.write(f"H-{i}\t-0.1\tthe cat sat on the mat .\n")

    mod = load_full_size_summarize()
    res = mod.summarize(str(tmp_path), str(tmp_path / "refs.en"))
    rows = res["mt"]["rows"]
    assert res["mt"]["common_update"] == 20 and list(rows) == ["softmax", "published"]
    assert rows["softmax"]["updates"] == 30 and rows["published"]["updates"] == 25
    assert rows["softmax"]["valid"] == {10: 7.5, 20: 6.25}
    assert rows["softmax"]["ms_per_update"] == pytest.approx(1000 / 4.5)  # median of 4 and 5 (the first third left out)
    assert (rows["softmax"]["gnorm_median"], rows["softmax"]["gnorm_max"]) == (2.0, 3.0)
    assert rows["published"]["radius"] == {"enc0": 0.99}
    assert rows["published"]["nullkey_curve"] == [(10, {"enc0": 0.75})]
    assert rows["softmax"]["errors"] == [] and "Minimum loss scale" in rows["published"]["errors"][0]
    assert rows["softmax"]["bleu"] == pytest.approx(100.0)
    assert rows["published"]["bleu"] < 50
    mod.print_tables(res)
    out = capsys.readouterr().out
    assert "| softmax | 30 |" in out and "| published | 25 |" in out and "@10" in out


def test_full_size_compare_rejects_bad_settings_before_training(tmp_path):
    env = {"DATA_MT": str(tmp_path), "DATA_LM": str(tmp_path), "RUNS": str(tmp_path / "runs")}
    for extra, message in (({"CONFIGS": "softmax frobnicate"}, "unknown configuration 'frobnicate'"),
                           ({"TASKS": "mt speech"}, "unknown task 'speech'"),
                           ({"MINUTES": "0"}, "MINUTES must be a positive number"),
                           ({"DATA_LM": str(tmp_path / "missing")}, "not found")):
        r = run(["bash", os.path.join(FULL, "compare.sh")], env={**os.environ, **env, **extra})
        assert r.returncode != 0 and message in r.stderr, (extra, r.stderr)
    assert not (tmp_path / "runs").exists()


def markdown_table(text: str, title: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the first markdown table after the line starting with ``title``."""
    rest = text[text.index(title):].splitlines()[1:]
    start = next(i for i, l in enumerate(rest) if l.startswith("| "))
    table = []
    for l in rest[start:]:
        if not l.startswith("|"):
            break
        table.append([c.strip() for c in l.strip().strip("|").split("|")])
    return table[0], table[2:]


def test_full_size_compare_end_to_end_on_the_cpu(wiki_data, tmp_path):
    """compare.sh with tiny language models on the CPU: two configurations side by side, the
    common update (the largest checkpoint both runs saved), the attention of both checkpoints
    there, and the summary table: one row per configuration, in order, whose updates and valid
    perplexities are those of that run's own json log (read here with fairseq_log_records), and
    whose entropy and past-zero cells are those of the run's entropy file at the common update."""
    import math

    from fourierformer_fairseq.fairseq_runs import fairseq_log_records

    assert wiki_data["prepare"].returncode == 0, wiki_data["prepare"].stderr[-2000:]
    runs = tmp_path / "runs"
    configs = ["softmax", "published"]
    # (the wall-clock budget far above what 12 updates take, so that a loaded machine's runs still reach
    # a common checkpoint: the runs end at --max-update)
    env = {**os.environ, "TASKS": "lm", "CONFIGS": " ".join(configs), "DATA_LM": str(wiki_data["data"]),
           "RUNS": str(runs), "MINUTES": "1", "EVERY_LM": "4", "DEVICE_ARGS": "--cpu", "SENTENCES": "2",
           "SIZE_LM": "--decoder-layers 1 --decoder-embed-dim 16 --decoder-ffn-embed-dim 32 "
                      "--decoder-attention-heads 2 --tokens-per-sample 32 --max-update 12"}
    r = run(["bash", os.path.join(FULL, "compare.sh")], env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    common = int((runs / "lm_common_update").read_text())
    saved = [{int(p.stem.split("_")[-1]) for p in (runs / f"lm_{c}" / "ckpt").glob("checkpoint_*_*.pt")} for c in configs]
    assert common in (4, 8, 12) and common == max(set.intersection(*saved)), (common, saved)

    header, rows = markdown_table(r.stdout, f"## lm: valid perplexity; evaluated at update {common}")
    assert [row[0] for row in rows] == configs, rows
    assert f"@{common}" in header, header
    for config, row in zip(configs, rows):
        cells = dict(zip(header, row))
        with open(runs / f"lm_{config}" / "train.log", errors="replace") as fh:
            records = list(fairseq_log_records(fh.read().splitlines()))
        valid = {int(rec["valid_num_updates"]): float(rec["valid_ppl"]) for tag, rec in records if tag == "valid"}
        reached = max([int(rec["num_updates"]) for tag, rec in records if tag == "train_inner"] + list(valid))
        assert common in valid and all(math.isfinite(v) for v in valid.values()), (config, valid)
        assert cells["updates"] == str(reached), (config, cells, reached)
        for column in (h for h in header if h.startswith("@")):
            assert cells[column] == f"{valid[int(column[1:])]:.1f}", (config, column, cells, valid)
        points = json.loads((runs / f"lm_{config}" / f"entropy_{common}.json").read_text())["points"]
        assert points[-1]["num_updates"] == common
        entropy = points[-1]["entropy"]
        sites = sorted(k for k in entropy if "/" not in k)
        assert sites and cells["entropy"] == " / ".join(f"{s} {entropy[s]:.2f}" for s in sites), (config, cells, entropy)
        past_zero = sorted(k for k in entropy if k.startswith("past_zero/"))
        assert cells["past zero"] == (" / ".join(f"{100 * entropy[k]:.2g} %" for k in past_zero) or "-"), (config, cells)
    assert "past_zero/dec" in json.loads((runs / "lm_published" / f"entropy_{common}.json").read_text())["points"][0]["entropy"]


def test_recipe_table_changes_options_in_place_appends_new_ones_and_refuses_unknown_drops():
    """fourierformer_fairseq/training_recipes.py, the one home of the recipes' hyper-parameters."""
    from fourierformer_fairseq.training_recipes import main, recipe_args, recipe_value

    base = recipe_args("iwslt14")
    changed = recipe_args("iwslt14", {"--lr": "1e-3", "--share-all-embeddings": None}, drop=("--max-epoch",))
    assert changed.index("--lr") == base.index("--lr") and changed[changed.index("--lr") + 1] == "1e-3"
    assert changed[-1] == "--share-all-embeddings" and "--max-epoch" not in changed
    assert base[base.index("--adam-betas") + 1] == recipe_value("iwslt14", "--adam-betas") == "(0.9, 0.98)"
    with pytest.raises(ValueError, match="no option --frobnicate"):
        recipe_args("iwslt14", drop=("--frobnicate",))
    assert main(["wikitext103", "--drop", "frobnicate"]) == 2


def test_train_scripts_read_their_defaults_from_the_recipe_table():
    """The help of each train.sh shows the table's values (a default written in the script would not follow it)."""
    from fourierformer_fairseq.training_recipes import recipe_value

    for train_sh, name in (("iwslt14/train.sh", "iwslt14"), ("wikitext103/train.sh", "wikitext103")):
        r = run(["bash", os.path.join(REPO, "examples", train_sh), "--help"])
        assert r.returncode == 0, r.stderr
        assert f"lr {recipe_value(name, '--lr')}" in r.stdout and "$R_" not in r.stdout
