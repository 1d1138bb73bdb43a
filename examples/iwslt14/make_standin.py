#!/usr/bin/env python3
"""Build a stand-in IWSLT'14 de-en archive folder from the official dev/test XML files.

The official archive (de-en.tgz) holds train.tags.de-en.{de,en} plus the
IWSLT14.TED*.xml dev/test files. Where only the XML files are at hand (no
internet), this writes a folder with the same layout, whose train.tags files are
made from the XML segments in the train.tags format (<url>, <keywords>,
<speaker>, <talkid>, <title>, <description> lines, then one segment a line), so
that ``prepare.sh --raw FOLDER`` runs the whole canonical pipeline offline. The
numbers it gives are not IWSLT'14 numbers: train and test overlap.

    python make_standin.py --xml-dir /path/to/de-en --out /tmp/iwslt14-standin [--tgz]
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import sys
import tarfile

DOC = re.compile(r"<doc\b")
TAG = re.compile(r"^\s*<(url|keywords|talkid|title|description|speaker)>(.*)</\1>\s*$")
SEG = re.compile(r'^\s*<seg id="[0-9]*">\s*(.*?)\s*</seg>\s*$')


def convert(xml_path: str) -> list[str]:
    """The train.tags-style lines of one XML file."""
    out: list[str] = []
    with open(xml_path, encoding="utf-8") as fh:
        for line in fh:
            m = TAG.match(line)
            if m:
                out.append(f"<{m.group(1)}>{m.group(2)}</{m.group(1)}>")
                if m.group(1) == "keywords":
                    out.append("<speaker>Stand-in Speaker</speaker>")
                continue
            m = SEG.match(line)
            if m:
                out.append(m.group(1))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--xml-dir", required=True, help="folder with IWSLT14.*.de-en.{de,en}.xml")
    p.add_argument("--out", required=True, help="output folder; the archive layout is OUT/de-en/")
    p.add_argument("--pair", default="de-en")
    p.add_argument("--tgz", action="store_true", help="also pack OUT/de-en.tgz (the official archive's layout)")
    args = p.parse_args(argv)
    src, tgt = args.pair.split("-")
    dest = os.path.join(args.out, args.pair)
    os.makedirs(dest, exist_ok=True)
    xmls = sorted(glob.glob(os.path.join(args.xml_dir, f"IWSLT14.*.{args.pair}.*.xml")))
    if not xmls:
        print(f"make_standin: no IWSLT14.*.{args.pair}.*.xml in {args.xml_dir}", file=sys.stderr)
        return 2
    for x in xmls:
        shutil.copy(x, dest)
    readme = os.path.join(args.xml_dir, "README")
    if os.path.isfile(readme):
        shutil.copy(readme, dest)
    counts = {}
    for lang in (src, tgt):
        lines: list[str] = []
        for x in xmls:
            if x.endswith(f".{lang}.xml"):
                lines += convert(x)
        with open(os.path.join(dest, f"train.tags.{args.pair}.{lang}"), "w", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)
        counts[lang] = len(lines)
    if counts[src] != counts[tgt]:
        print(f"make_standin: the two sides differ ({counts}); the XML files do not align", file=sys.stderr)
        return 1
    if args.tgz:
        with tarfile.open(os.path.join(args.out, f"{args.pair}.tgz"), "w:gz") as tar:
            tar.add(dest, arcname=args.pair)
    print(f"make_standin: {dest}: train.tags.{args.pair}.{{{src},{tgt}}} with {counts[src]} lines each, "
          f"{len(xmls)} XML files" + (f"; packed {args.out}/{args.pair}.tgz" if args.tgz else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
