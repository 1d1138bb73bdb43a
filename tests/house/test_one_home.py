"""Facts with one home: the fairseq pin (FAIRSEQ_REQUIREMENT) and the paper's numbers
(scripts/analysis/tables/paper_numbers.json) are spelled in one place and read or linked everywhere else."""
from __future__ import annotations

import json
import os
import subprocess

from repo import REPO, load, script, tracked_texts


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# --------------------------------------------------------------------------- facts with one home


def _tracked_files():
    """The repository's tracked text files (relative paths), the dated records aside."""
    files = [(path, text) for path, text in tracked_texts() if not path.startswith("docs/records/")]
    assert files, "not a git checkout"
    return files


def test_the_fairseq_pin_has_one_home():
    """FAIRSEQ_REQUIREMENT in fourierformer_fairseq/__init__.py is the only place the fairseq pin is
    spelled: setup.py's extra, scripts/tools/install.sh and the offline bundle read it there, and no other
    file (the dated records aside) names the pinned requirement, nor its version in code or the READMEs."""
    import re

    from fourierformer_fairseq import FAIRSEQ_REQUIREMENT

    name, version = FAIRSEQ_REQUIREMENT.split("==")
    spec = re.compile(rf"{re.escape(name)}\s*==")
    code = (".py", ".sh", ".txt", ".toml", ".cfg", ".yml", ".yaml", ".in")
    copies = []
    for path, text in _tracked_files():
        if path == "fourierformer_fairseq/__init__.py" or path.startswith("tests/"):
            continue
        if spec.search(text) or ((path.endswith(code) or path.endswith("README.md")) and version in text):
            copies.append(path)
    assert not copies, f"the fairseq pin is copied outside FAIRSEQ_REQUIREMENT: {copies}"

    # its readers: setup.py's extra, install.sh's line, the offline bundle's roots
    setup_text = open(os.path.join(REPO, "setup.py")).read()
    assert 'package_constant("FAIRSEQ_REQUIREMENT")' in setup_text
    namespace = {"__file__": os.path.join(REPO, "setup.py")}
    exec(compile(setup_text.split("\next_modules, cmdclass =")[0], "setup.py", "exec"), namespace)
    assert namespace["package_constant"]("FAIRSEQ_REQUIREMENT") == FAIRSEQ_REQUIREMENT
    (line,) = [l for l in open(script("scripts/tools/install.sh")).read().splitlines() if l.startswith("FAIRSEQ_SPEC=")]
    r = run(["bash", "-c", f"{line}; printf %s \"$FAIRSEQ_SPEC\""], cwd=REPO)
    assert r.stdout == FAIRSEQ_REQUIREMENT, r.stderr
    assert FAIRSEQ_REQUIREMENT in load("scripts/tools/offline_bundle.py").OFFLINE_ROOTS


def test_the_papers_numbers_have_one_home():
    """scripts/analysis/tables/paper_numbers.json holds the paper's numbers; the READMEs, the recipes, the
    package, the tools and the kernels restate none of its perplexities or BLEU scores (every value of
    10 or more, as the paper writes it, to two decimals), they link it. (docs/ is left out: its tables
    of measurements would match by chance; its records may cite the paper beside a measured number.)"""
    import re

    numbers = []

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 10:
            numbers.append(f"{x:.2f}")

    walk(json.load(open(os.path.join(REPO, "scripts", "analysis", "tables", "paper_numbers.json"))))
    assert "34.42" in numbers and "32.85" in numbers
    pattern = re.compile(r"(?<![\d.])(" + "|".join(re.escape(n) for n in sorted(set(numbers))) + r")(?![\d])")
    product = ("README.md", "setup.py", "examples/", "fourierformer_fairseq/", "scripts/tools/", "scripts/benchmarks/", "scripts/analysis/", "csrc/")
    copies = {path: sorted(set(pattern.findall(text))) for path, text in _tracked_files()
              if path.startswith(product) and path != "scripts/analysis/tables/paper_numbers.json" and pattern.search(text)}
    assert not copies, f"the paper's numbers restated outside scripts/analysis/tables/paper_numbers.json: {copies}"
