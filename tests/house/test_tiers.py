"""The tiers are set per room: every room of tests/ has a conftest.py stating its tier and its
exceptions (tests/tiers.py), every exception names a file or a test function of its room, no
test file marks a test slow itself, and docs/testing.md's table of the rooms names every room."""
import ast
import glob
import importlib.util
import os
import re

import pytest

from repo import TESTS

ROOMS = sorted({os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(TESTS, "*", "test_*.py"))})


def room_conftest(room):
    path = os.path.join(TESTS, room, "conftest.py")
    assert os.path.isfile(path), f"tests/{room}/ has no conftest.py stating its tier"
    spec = importlib.util.spec_from_file_location(f"conftest_{room}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_room_is_in_the_testing_page():
    text = open(os.path.join(TESTS, "..", "docs", "testing.md"), encoding="utf-8").read()
    table = text.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    missing = [room for room in ROOMS if f"| `tests/{room}/` |" not in table]
    assert len(ROOMS) >= 8 and not missing, f"docs/testing.md's rooms table lacks {missing}"


@pytest.mark.parametrize("room", ROOMS)
def test_every_exception_names_a_file_or_a_test_of_its_room(room):
    conftest = room_conftest(room)
    assert conftest.ROOM in ("fast", "slow")
    files = {os.path.basename(p): p for p in glob.glob(os.path.join(TESTS, room, "test_*.py"))}
    functions = set()
    for path in files.values():
        functions |= {node.name for node in ast.parse(open(path).read()).body if isinstance(node, ast.FunctionDef)}
    unknown = [key for key in conftest.EXCEPTIONS if key not in files and key.split("[")[0] not in functions]
    assert not unknown, f"tests/{room}/conftest.py names what its room does not hold: {unknown}"
    redundant = [key for key, tier in conftest.EXCEPTIONS.items() if key in files and tier == conftest.ROOM]
    assert not redundant, f"tests/{room}/conftest.py: files of the room's own tier: {redundant}"


def test_no_test_file_marks_its_tests_slow():
    marked = [os.path.relpath(p, TESTS) for p in glob.glob(os.path.join(TESTS, "*", "test_*.py"))
              if re.search(r"pytest\.mark\.slow|pytestmark\s*=.*\bslow\b", open(p).read())]
    assert not marked, f"a test's tier is its room's (tests/<room>/conftest.py): {marked}"
