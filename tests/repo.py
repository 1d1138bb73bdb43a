"""Where the project's tools live, for tests that run or import them.

The tools sit in rooms by purpose beside the package: ``scripts/benchmarks/``, ``scripts/tools/``,
``scripts/analysis/tables/`` and ``scripts/analysis/dynamics/``. A test names the tool it tests
by its path in the repository (``script("scripts/tools/average_checkpoints.py")``), so that
``git grep`` for a tool's path finds its tests, and a tool that moves fails its tests by name.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")  # the shared helpers' folder (every room imports them by name)


def script(path: str) -> str:
    """The absolute path of the tool at ``path``, relative to the repository
    (``scripts/analysis/tables/make_tables.py``, ``scripts/tools/install.sh``)."""
    if os.path.isabs(path) or "/" not in path:
        raise ValueError(f"{path}: name a tool by its path in the repository, e.g. scripts/tools/install.sh")
    full = os.path.join(REPO, path)
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{path}: no such tool in {REPO}")
    return full


def tracked_texts(*paths: str):
    """(path, text) of every file git tracks (below ``paths``, or all), paths relative to the
    repository; binary files are passed over. Outside a git checkout: nothing (an empty list)."""
    out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        return []
    found = []
    for path in filter(None, out.stdout.split("\0")):
        full = os.path.join(REPO, path)
        if not os.path.isfile(full):
            continue
        try:
            found.append((path, open(full, encoding="utf-8").read()))
        except UnicodeDecodeError:  # a binary file
            continue
    return found


def load(path: str):
    """Import the tool at ``path`` (relative to the repository) as a module named after its file
    (its ``main`` is not run)."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, script(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
