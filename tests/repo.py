"""Where the project's tools live, for tests that run or import them.

The tools sit in rooms by purpose beside the package: ``scripts/benchmarks/``, ``scripts/tools/``,
``scripts/analysis/tables/`` and ``scripts/analysis/dynamics/``. Tests name a tool by its file name; ``script``
finds it in whichever room holds it, so a tool can move between rooms without touching its tests.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")  # the shared helpers' folder (every room imports them by name)
ROOMS = tuple(os.path.join("scripts", *room) for room in (("benchmarks",), ("tools",), ("analysis", "tables"), ("analysis", "dynamics")))


def script(name: str) -> str:
    """The path of the tool ``name`` (``make_tables`` or ``make_tables.py``, ``install.sh``)."""
    fname = name if os.path.splitext(name)[1] else f"{name}.py"
    found = [os.path.join(REPO, room, fname) for room in ROOMS if os.path.isfile(os.path.join(REPO, room, fname))]
    if len(found) != 1:
        raise FileNotFoundError(f"{fname}: {'in ' + ', '.join(found) if found else 'in none'} of {', '.join(ROOMS)}")
    return found[0]


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


def load(name: str):
    """Import the tool ``name`` as a module (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(name, script(name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
