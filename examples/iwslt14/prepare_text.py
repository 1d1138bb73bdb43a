#!/usr/bin/env python3
"""Text side of examples/iwslt14/prepare.sh: fairseq's prepare-iwslt14.sh in Python.

Reproduces, step for step, the canonical pipeline
(fairseq/examples/translation/prepare-iwslt14.sh) with tools from PyPI:

  Moses tokenizer.perl -l L      -> sacremoses.MosesTokenizer(L).tokenize(escape=True)
  Moses lowercase.perl           -> str.lower()
  Moses clean-corpus-n.perl -ratio 1.5 ... 1 175  -> clean_corpus() below
  subword-nmt learn_bpe.py -s 10000 / apply_bpe.py -> the subword-nmt package

Two corpora:

  iwslt14  the official archive's folder (train.tags.de-en.{de,en} and the
           IWSLT14.TED*.xml dev/test files): train/valid split every 23rd pair,
           test = dev2010 + TEDX.dev2012 + tst2010 + tst2011 + tst2012
           (the canonical script's order).
  text     plain parallel text files (one sentence a line), e.g. Multi30k:
           train is tokenised and cleaned as above, valid/test are tokenised
           only (like the canonical script's XML dev/test sets).

Outputs in OUT: tmp/{train,valid,test}.{src,tgt} (tokenised, lowercased: the text
before BPE), {train,valid,test}.{src,tgt} (BPE), code (BPE merges),
raw/test.{src,tgt} (untokenised test sentences, for sacreBLEU) and stats.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
from multiprocessing import Pool

CANONICAL_TEST_ORDER = ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012")
TRAIN_DROP = ("<url>", "<talkid>", "<keywords>")
TRAIN_STRIP = ("<title>", "</title>", "<description>", "</description>")


def log(msg: str) -> None:
    print(f"[prepare] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- tokenising
_TOKENIZERS: dict = {}


def _tokenizer(lang: str):
    if lang not in _TOKENIZERS:
        from sacremoses import MosesTokenizer

        class HeadMosesTokenizer(MosesTokenizer):
            """sacremoses plus the one rule of Moses' current tokenizer.perl it lacks.

            tokenizer.perl splits the period off the last word of a line always
            ("split last words independently as they are unlikely to be non-breaking
            prefixes"), e.g. "... ist 70." -> "... ist 70 ." and "the u.s." -> "the u.s .";
            sacremoses 0.x keeps it when the word is a known prefix or holds a period.
            """

            def handles_nonbreaking_prefixes(self, text):
                text = super().handles_nonbreaking_prefixes(text)
                tokens = text.split(" ")
                if tokens and len(tokens[-1]) > 1 and tokens[-1].endswith("."):
                    tokens[-1] = tokens[-1][:-1] + " ."
                return " ".join(tokens)

        _TOKENIZERS[lang] = HeadMosesTokenizer(lang=lang)
    return _TOKENIZERS[lang]


def tokenize_line(lang: str, line: str) -> str:
    """tokenizer.perl -l LANG (no -a, HTML escaping on) on one line without its newline."""
    # tokenizer.perl prints lines that are empty or all whitespace unchanged
    if not line.strip():
        return line
    return _tokenizer(lang).tokenize(line, aggressive_dash_splits=False, return_str=True, escape=True)


def _tokenize_chunk(args):
    lang, lines = args
    return [tokenize_line(lang, x) for x in lines]


def tokenize_lines(lines: list[str], lang: str, workers: int, what: str) -> list[str]:
    chunk = 2000
    chunks = [(lang, lines[i:i + chunk]) for i in range(0, len(lines), chunk)]
    out: list[str] = []
    t0 = time.time()
    if workers > 1 and len(chunks) > 1:
        with Pool(workers) as pool:
            for i, part in enumerate(pool.imap(_tokenize_chunk, chunks)):
                out.extend(part)
                if (i + 1) % 20 == 0:
                    log(f"  tokenised {len(out):,}/{len(lines):,} lines of {what}")
    else:
        for i, c in enumerate(chunks):
            out.extend(_tokenize_chunk(c))
            if (i + 1) % 20 == 0:
                log(f"  tokenised {len(out):,}/{len(lines):,} lines of {what}")
    log(f"  tokenised {what}: {len(out):,} lines in {time.time() - t0:.1f}s")
    return out


def lowercase(lines: list[str]) -> list[str]:
    """lowercase.perl: perl's lc() (full Unicode lowercase mapping, as str.lower())."""
    return [x.lower() for x in lines]


# --------------------------------------------------------------------------- cleaning
_WS = re.compile(r"\s+")


def _norm_ws(s: str) -> str:
    s = _WS.sub(" ", s)
    if s.startswith(" "):
        s = s[1:]
    if s.endswith(" "):
        s = s[:-1]
    return s


def clean_corpus(src: list[str], tgt: list[str], lo: int = 1, hi: int = 175, ratio: float = 1.5,
                 max_word_length: int = 1000):
    """clean-corpus-n.perl -ratio RATIO corpus l1 l2 out LO HI, on lists; returns kept (src, tgt)."""
    if len(src) != len(tgt):
        raise SystemExit(f"clean: the two sides differ in length ({len(src)} vs {len(tgt)} lines)")
    factored = bool(src) and ("|" in src[0] or "|" in tgt[0])
    too_long = re.compile(r"[^\s|]{%d}" % (max_word_length + 1))
    out_s, out_t = [], []
    for f, e in zip(src, tgt):
        if not factored:
            f = f.replace("|", "")
            e = e.replace("|", "")
        f, e = _norm_ws(f), _norm_ws(e)
        if f == "" or e == "":
            continue
        fc, ec = len(f.split(" ")), len(e.split(" "))
        if ec > hi or fc > hi or ec < lo or fc < lo:
            continue
        if ec / fc > ratio or fc / ec > ratio:
            continue
        if too_long.search(e) or too_long.search(f):
            continue
        out_s.append(f)
        out_t.append(e)
    return out_s, out_t


# --------------------------------------------------------------------------- reading
def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", newline="\n") as fh:
        return [x[:-1] if x.endswith("\n") else x for x in fh]


def write_lines(path: str, lines: list[str]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for x in lines:
            fh.write(x + "\n")


def train_tags_lines(path: str) -> list[str]:
    """grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>' | sed (strip title/description tags)."""
    out = []
    for line in read_lines(path):
        if any(tag in line for tag in TRAIN_DROP):
            continue
        for tag in TRAIN_STRIP:
            line = line.replace(tag, "")
        out.append(line)
    return out


_SEG_OPEN = re.compile(r'<seg id="[0-9]*">[ \t\r\f\v]*')
_SEG_CLOSE = re.compile(r"[ \t\r\f\v]*</seg>[ \t\r\f\v]*")


def xml_segments(path: str, apostrophe: bool = True) -> list[str]:
    """grep '<seg id' | sed 's/<seg id="[0-9]*">\\s*//g' | sed 's/\\s*<\\/seg>\\s*//g' | sed "s/’/'/g"."""
    out = []
    for line in read_lines(path):
        if "<seg id" not in line:
            continue
        line = _SEG_OPEN.sub("", line)
        line = _SEG_CLOSE.sub("", line)
        if apostrophe:
            line = line.replace("\u2019", "'")
        out.append(line)
    return out


def find_xml(orig: str, name: str, lang: str, pair: str) -> str:
    path = os.path.join(orig, f"IWSLT14.{name}.{pair}.{lang}.xml")
    if not os.path.isfile(path):
        raise SystemExit(f"missing {path}: the archive must hold IWSLT14.{name}.{pair}.{{de,en}}.xml")
    return path


# --------------------------------------------------------------------------- BPE
def learn_bpe(train_files: list[str], code_path: str, merges: int) -> None:
    from subword_nmt.learn_bpe import learn_bpe as _learn

    t0 = time.time()
    joined = code_path + ".train-joint"
    with open(joined, "w", encoding="utf-8") as out:
        for f in train_files:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    out.write(line)
    with open(joined, encoding="utf-8") as inp, open(code_path, "w", encoding="utf-8") as out:
        _learn(inp, out, merges)
    os.remove(joined)
    log(f"  learned {merges} BPE merges in {time.time() - t0:.1f}s -> {code_path}")


def apply_bpe(code_path: str, src: str, dst: str) -> None:
    from subword_nmt.apply_bpe import BPE

    with open(code_path, encoding="utf-8") as fh:
        bpe = BPE(fh)
    with open(src, encoding="utf-8") as inp, open(dst, "w", encoding="utf-8") as out:
        for line in inp:
            out.write(bpe.process_line(line))


# --------------------------------------------------------------------------- pipelines
def prepare_iwslt14(args) -> dict:
    s, t = args.src, args.tgt
    pair = f"{s}-{t}"
    orig, out = args.orig, args.out
    tmp = os.path.join(out, "tmp")
    stats: dict = {"corpus": "iwslt14", "orig": os.path.abspath(orig)}

    log("pre-processing train data...")
    tok = {}
    for lang in (s, t):
        path = os.path.join(orig, f"train.tags.{pair}.{lang}")
        if not os.path.isfile(path):
            raise SystemExit(f"missing {path}: is {orig} the archive's {pair} folder?")
        lines = train_tags_lines(path)
        if args.max_train_lines:
            lines = lines[: args.max_train_lines]
        stats[f"train_tags_lines.{lang}"] = len(lines)
        tok[lang] = tokenize_lines(lines, lang, args.workers, f"train.tags.{pair}.{lang}")
    if len(tok[s]) != len(tok[t]):
        raise SystemExit(f"train.tags.{pair}.{s} and .{t} differ in length after tag filtering "
                         f"({len(tok[s])} vs {len(tok[t])} lines)")
    cs, ct = clean_corpus(tok[s], tok[t], args.min_len, args.max_len, args.ratio)
    log(f"clean-corpus: {len(tok[s]):,} pairs in, {len(cs):,} out (length {args.min_len}..{args.max_len}, ratio {args.ratio})")
    train = {s: lowercase(cs), t: lowercase(ct)}

    log("pre-processing valid/test data...")
    test = {s: [], t: []}
    raw_test = {s: [], t: []}
    for lang in (s, t):
        for name in CANONICAL_TEST_ORDER:
            path = find_xml(orig, name, lang, pair)
            segs = xml_segments(path)
            raw_test[lang].extend(xml_segments(path, apostrophe=False))
            toks = lowercase(tokenize_lines(segs, lang, args.workers, os.path.basename(path)))
            write_lines(os.path.join(tmp, f"IWSLT14.{name}.{pair}.{lang}"), toks)
            stats[f"{name}.{lang}"] = len(toks)
            test[lang].extend(toks)

    log("creating train, valid, test...")
    splits = {}
    for lang in (s, t):
        lines = train[lang]
        splits[("valid", lang)] = [x for i, x in enumerate(lines, 1) if i % 23 == 0]
        splits[("train", lang)] = [x for i, x in enumerate(lines, 1) if i % 23 != 0]
        splits[("test", lang)] = test[lang]
        write_lines(os.path.join(out, "raw", f"test.{lang}"), raw_test[lang])
    return finish(args, splits, stats)


def prepare_text(args) -> dict:
    s, t = args.src, args.tgt
    stats: dict = {"corpus": "text"}
    splits = {}
    raw_test = {}
    for split, prefix in (("train", args.train), ("valid", args.valid), ("test", args.test)):
        if not prefix:
            continue
        lines = {}
        for lang in (s, t):
            path = f"{prefix}.{lang}"
            if not os.path.isfile(path):
                raise SystemExit(f"missing {path} (--{split} {prefix})")
            lines[lang] = read_lines(path)
            if split == "train" and args.max_train_lines:
                lines[lang] = lines[lang][: args.max_train_lines]
            if split == "test":
                raw_test[lang] = list(lines[lang])
        if len(lines[s]) != len(lines[t]):
            raise SystemExit(f"{prefix}.{s} and {prefix}.{t} differ in length ({len(lines[s])} vs {len(lines[t])} lines)")
        if split != "train":
            # like the dev/test XML sets of the canonical script: the apostrophe, then tokenise
            lines = {lang: [x.replace("\u2019", "'") for x in v] for lang, v in lines.items()}
        tok = {lang: tokenize_lines(lines[lang], lang, args.workers, f"{os.path.basename(prefix)}.{lang}") for lang in (s, t)}
        if split == "train":
            cs, ct = clean_corpus(tok[s], tok[t], args.min_len, args.max_len, args.ratio)
            log(f"clean-corpus: {len(tok[s]):,} pairs in, {len(cs):,} out")
            tok = {s: cs, t: ct}
        for lang in (s, t):
            splits[(split, lang)] = lowercase(tok[lang])
    for lang, v in raw_test.items():
        write_lines(os.path.join(args.out, "raw", f"test.{lang}"), v)
    return finish(args, splits, stats)


def finish(args, splits: dict, stats: dict) -> dict:
    s, t = args.src, args.tgt
    if args.max_eval_lines:
        for key in list(splits):
            if key[0] != "train":
                splits[key] = splits[key][: args.max_eval_lines]
        raw = os.path.join(args.out, "raw")
        for lang in (s, t):
            path = os.path.join(raw, f"test.{lang}")
            if os.path.exists(path):
                write_lines(path, read_lines(path)[: args.max_eval_lines])
    out, tmp = args.out, os.path.join(args.out, "tmp")
    names = sorted({split for split, _ in splits})
    for (split, lang), lines in splits.items():
        write_lines(os.path.join(tmp, f"{split}.{lang}"), lines)
        stats[f"{split}.{lang}"] = len(lines)
    for split in names:
        log(f"  {split}: {len(splits[(split, s)]):,} pairs")

    code = os.path.join(out, "code")
    log(f"learn_bpe ({args.bpe_merges} merges, joint {s}+{t}) on {tmp}/train.{s} + {tmp}/train.{t}...")
    learn_bpe([os.path.join(tmp, f"train.{s}"), os.path.join(tmp, f"train.{t}")], code, args.bpe_merges)
    for lang in (s, t):
        for split in names:
            log(f"apply_bpe to {split}.{lang}...")
            apply_bpe(code, os.path.join(tmp, f"{split}.{lang}"), os.path.join(out, f"{split}.{lang}"))
    stats["bpe_merges"] = args.bpe_merges
    with open(os.path.join(out, "stats.json"), "w") as fh:
        json.dump(stats, fh, indent=1, sort_keys=True)
    return stats


def locate_orig(path: str, pair: str) -> str:
    """The folder that holds train.tags.PAIR.*: PATH itself, or PATH/PAIR, or one level deeper."""
    cands = [path, os.path.join(path, pair)] + sorted(glob.glob(os.path.join(path, "*", pair))) + sorted(glob.glob(os.path.join(path, "*")))
    for c in cands:
        if os.path.isdir(c) and glob.glob(os.path.join(c, f"train.tags.{pair}.*")):
            return c
    raise SystemExit(f"no train.tags.{pair}.* under {path} (looked in {path}, {path}/{pair} and one level below)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", choices=("iwslt14", "text"), default="iwslt14")
    p.add_argument("--orig", help="iwslt14: the extracted archive (folder with train.tags.de-en.* and the XML files)")
    p.add_argument("--train", help="text: train prefix (PREFIX.SRC and PREFIX.TGT)")
    p.add_argument("--valid", help="text: valid prefix")
    p.add_argument("--test", help="text: test prefix (optional)")
    p.add_argument("--out", required=True)
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--bpe-merges", type=int, default=10000)
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--max-len", type=int, default=175)
    p.add_argument("--ratio", type=float, default=1.5)
    p.add_argument("--max-train-lines", type=int, default=0, help="keep only the first N training lines (small mode)")
    p.add_argument("--max-eval-lines", type=int, default=0, help="keep only the first N valid/test pairs (small mode)")
    p.add_argument("--workers", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    if args.corpus == "iwslt14":
        if not args.orig:
            p.error("--corpus iwslt14 needs --orig")
        args.orig = locate_orig(args.orig, f"{args.src}-{args.tgt}")
        stats = prepare_iwslt14(args)
    else:
        if not (args.train and args.valid):
            p.error("--corpus text needs --train and --valid")
        stats = prepare_text(args)
    log(f"text pipeline done in {time.time() - t0:.1f}s: " + ", ".join(
        f"{k}={v}" for k, v in sorted(stats.items()) if k.split(".")[0] in ("train", "valid", "test")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
