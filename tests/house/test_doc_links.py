"""Every relative link of the README, examples/README.md and every page under docs/ (the records included) resolves: the file exists and,
for a link into a markdown file, the anchor is one of its headings (GitHub's slugs: lower case,
punctuation but '-' and '_' dropped, spaces to '-', a repeated heading numbered -1, -2, ...)."""
from __future__ import annotations

import glob
import os
import re

import pytest

from repo import REPO  # noqa: E402

ROOT = REPO
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set:
    out, seen = set(), {}
    for line in FENCE.sub("", open(path, encoding="utf-8").read()).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(path: str) -> list:
    bad = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", FENCE.sub("", open(path, encoding="utf-8").read())):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            bad.append(f"{target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor")
    return bad


DOCS = sorted([os.path.join(ROOT, "README.md"), os.path.join(ROOT, "examples", "README.md"),
               *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)])


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(path):
    assert not broken_links(path), broken_links(path)


def test_a_broken_file_or_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Top `x`: y\n\n## Top `x`: y\n\n[ok](#top-x-y-1) [bad](#nope) [gone](b.md) "
                                   "[web](https://example.com/#x)\n```\n[in code](c.md)\n```\n")
    assert broken_links(str(tmp_path / "a.md")) == ["#nope: no heading with that anchor", "b.md: no such file"]
