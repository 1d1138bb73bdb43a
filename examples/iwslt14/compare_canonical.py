#!/usr/bin/env python3
"""Measure how closely prepare_text.py matches the canonical Moses-perl pipeline.

For every IWSLT14.TED*.{de,en}.xml file in --orig it runs, line for line,

  canonical: grep '<seg id' | sed ... | sed "s/’/'/g" | perl tokenizer.perl -threads 8 -l L | perl lowercase.perl
  ours:      prepare_text.xml_segments -> sacremoses -> str.lower()

(the exact commands of fairseq's prepare-iwslt14.sh for the dev/test sets) and, with
--train, the train.tags files too (tag filtering + tokenisation, before cleaning),
and prints the number and share of identical lines per file, plus the first
differing lines. Needs perl and a folder of Moses scripts (--moses-scripts DIR
holding tokenizer/tokenizer.perl, tokenizer/lowercase.perl and the
nonbreaking_prefixes tokenizer.perl loads); nothing of Moses ships here.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prepare_text as P  # noqa: E402


def perl_xml(path: str, lang: str, scripts: str, threads: int) -> list[str]:
    tok = os.path.join(scripts, "tokenizer", "tokenizer.perl")
    lc = os.path.join(scripts, "tokenizer", "lowercase.perl")
    cmd = (
        f"grep '<seg id' '{path}' | sed -e 's/<seg id=\"[0-9]*\">\\s*//g' | sed -e 's/\\s*<\\/seg>\\s*//g' | "
        f"sed -e \"s/\\’/\\'/g\" | perl '{tok}' -threads {threads} -q -l {lang} | perl '{lc}'"
    )
    out = subprocess.run(["bash", "-c", cmd], check=True, capture_output=True)
    return out.stdout.decode("utf-8").split("\n")[:-1]


def perl_train(path: str, lang: str, scripts: str, threads: int) -> list[str]:
    tok = os.path.join(scripts, "tokenizer", "tokenizer.perl")
    cmd = (
        f"cat '{path}' | grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>' | sed -e 's/<title>//g' | "
        f"sed -e 's/<\\/title>//g' | sed -e 's/<description>//g' | sed -e 's/<\\/description>//g' | "
        f"perl '{tok}' -threads {threads} -q -l {lang}"
    )
    out = subprocess.run(["bash", "-c", cmd], check=True, capture_output=True)
    return out.stdout.decode("utf-8").split("\n")[:-1]


def compare(name: str, ref: list[str], ours: list[str], show: int) -> dict:
    n = max(len(ref), len(ours))
    same = sum(1 for a, b in zip(ref, ours) if a == b)
    diffs = [(i, a, b) for i, (a, b) in enumerate(zip(ref, ours)) if a != b][:show]
    return {"file": name, "lines_canonical": len(ref), "lines_ours": len(ours), "identical": same,
            "share": same / n if n else 1.0, "first_differences": diffs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--orig", required=True, help="the archive's de-en folder (or one with the XML files)")
    p.add_argument("--moses-scripts", required=True, help="Moses 'scripts' folder (tokenizer/tokenizer.perl ...)")
    p.add_argument("--train", action="store_true", help="also compare the train.tags files (before cleaning)")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--show", type=int, default=3, help="differing lines to print per file")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)

    rows = []
    for path in sorted(glob.glob(os.path.join(args.orig, "IWSLT14.TED*.xml"))):
        lang = path.split(".")[-2]
        ref = perl_xml(path, lang, args.moses_scripts, args.threads)
        ours = P.lowercase([P.tokenize_line(lang, x) for x in P.xml_segments(path)])
        rows.append(compare(os.path.basename(path), ref, ours, args.show))
    if args.train:
        for path in sorted(glob.glob(os.path.join(args.orig, "train.tags.*"))):
            lang = path.split(".")[-1]
            ref = perl_train(path, lang, args.moses_scripts, args.threads)
            ours = [P.tokenize_line(lang, x) for x in P.train_tags_lines(path)]
            rows.append(compare(os.path.basename(path), ref, ours, args.show))
    if not rows:
        print(f"compare_canonical: no IWSLT14.TED*.xml in {args.orig}", file=sys.stderr)
        return 2

    total = sum(max(r["lines_canonical"], r["lines_ours"]) for r in rows)
    same = sum(r["identical"] for r in rows)
    print(f"{'file':45s} {'lines':>7s} {'identical':>9s} {'share':>8s}")
    for r in rows:
        print(f"{r['file']:45s} {r['lines_canonical']:7d} {r['identical']:9d} {100 * r['share']:7.3f}%")
    print(f"{'all':45s} {total:7d} {same:9d} {100 * same / total:7.3f}%")
    for r in rows:
        for i, a, b in r["first_differences"]:
            print(f"\n{r['file']} line {i + 1}:\n  canonical: {a}\n  ours:      {b}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "total": total, "identical": same}, fh, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
