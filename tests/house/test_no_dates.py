"""Measured numbers live in the dated records (docs/records/), nowhere else.

The product states rules, designs and verdicts and links the record; a date in the package, the
kernels, the tools' code, the recipes, the ``--help`` strings (they are the package's code, and
docs/usage.md is generated from them) or the README marks a measurement that went to the wrong
place: the next measurement would have to re-record it there. This test fails on one, naming the
file and line.
"""
from __future__ import annotations

import re

import pytest

from repo import tracked_texts

# where no date may appear: the product and its tools (every tracked text file below these)
CHECKED = ("fourierformer_fairseq", "csrc", "scripts", "examples", ".ci",
           "README.md", "docs/usage.md", "setup.py", "pyproject.toml", "requirements.txt")

_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
DATE = re.compile(
    r"\b(19|20)\d\d[-/.](0[1-9]|1[0-2])[-/.](0[1-9]|[12]\d|3[01])\b"          # 2026-11-28, 2026/11/28
    rf"|\b({_MONTHS})\.? ([1-9]|[12]\d|3[01])(st|nd|rd|th)?\b(,? (19|20)\d\d)?"  # Nov 28, November 28, 2026
    rf"|\b([1-9]|[12]\d|3[01]) ({_MONTHS}) (19|20)\d\d\b"                     # 28 November 2026
    r"|(?i:\b(the day before|yesterday|last (week|night|session)|this morning)\b)")  # said relatively


def dated_lines(text: str) -> list[tuple[int, str]]:
    """(line number, the date found) for every line of text that carries a date."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in [DATE.search(line)] if m]


@pytest.mark.parametrize("text, found", [
    ("measured 2026-11-28 on a 2-core CPU", "2026-11-28"),
    ("// 9.4 the day before, 12.3 now", "the day before"),
    ("see the run of Nov 27, 2026", "Nov 27, 2026"),
    ("on 27 November 2026 the card", "27 November 2026"),
    ("a run from 2026/12/01", "2026/12/01"),
])
def test_the_finder_sees_each_form_of_a_date(text, found):
    assert dated_lines("first line\n" + text) == [(2, found)]


@pytest.mark.parametrize("text", [
    "NeurIPS 2022", "year={2022}", "(1, 2, 2026)", "--max-update 500000", "lr 2.5e-4, 16-11-2",
    "fairseq-fixed==0.12.3.1", "may 2 ranks", "Mar 3x faster", "torch 2.13.0", "%Y-%m-%d",
])
def test_the_finder_leaves_what_is_not_a_date(text):
    assert dated_lines(text) == []


def test_no_date_outside_the_records():
    files = tracked_texts(*CHECKED)
    if not files:
        pytest.skip("not a git checkout")
    assert any(p.startswith("fourierformer_fairseq/") for p, _ in files) and "README.md" in dict(files)
    found = [f"{path}:{n}: {date!r}" for path, text in files for n, date in dated_lines(text)]
    assert not found, ("dates outside docs/records/ (move the measurement to its record and link it; "
                       "docs/records/README.md):\n  " + "\n  ".join(found))
