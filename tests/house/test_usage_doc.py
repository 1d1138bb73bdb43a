"""docs/usage.md is generated from the declared options (``python -m fourierformer_fairseq.usage_doc --write``).

The generator reads the option dataclasses, the registered architectures and what fairseq's parser
and the arch functions give each arch; the file must be what it writes now, so a changed option
(its help, default, choices, a new field, a new arch or preset) fails here until the file is
regenerated.
"""
import dataclasses
import difflib

import pytest

from fourierformer_fairseq import usage_doc


@pytest.fixture(scope="module")
def kinds():
    return usage_doc.collect()


def test_usage_doc_is_current(kinds):
    with open(usage_doc.DOC_PATH, encoding="utf-8") as fh:
        current = fh.read()
    fresh = usage_doc.render(kinds)
    diff = "".join(list(difflib.unified_diff(current.splitlines(True), fresh.splitlines(True),
                                             "docs/usage.md", "generated"))[:40])
    assert current == fresh, f"docs/usage.md is stale: run {usage_doc.COMMAND}\n{diff}"


def test_usage_doc_reads_the_declarations(kinds, monkeypatch):
    """The reference follows the dataclass: a changed help text shows, under its flag, and the old one is gone."""
    from fourierformer_fairseq.models.fourierformer import FourierAttentionConfig

    field = {f.name: f for f in dataclasses.fields(FourierAttentionConfig)}["fourier_kernel"]
    old = field.metadata["help"]
    monkeypatch.setattr(field, "metadata", {**field.metadata, "help": "a changed meaning of the kernel"})
    text = usage_doc.render(kinds)
    section = text.split("### `--fourier-kernel ")[1].split("###")[0]
    assert "a changed meaning of the kernel" in section and old not in text


def test_every_option_and_arch_is_listed(kinds):
    """Each field of each kind's config has a section, each arch a row and a default."""
    text = usage_doc.render(kinds)
    assert {k.options_class.attention_class.__name__ for k in kinds} == {
        "FourierMultiheadAttention", "PerformerMultiheadAttention", "GlobalFilterMixer"}
    for kind in kinds:
        for arch in kind.archs:
            assert f"| `{arch}` |" in text
        for f in kind.fields:
            assert f"### `--{f.name.replace('_', '-')}" in text, f.name
