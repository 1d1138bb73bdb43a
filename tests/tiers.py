"""The tier of a test is a property of its room, with named exceptions.

Each room's ``conftest.py`` states its tier (``"fast"`` or ``"slow"``) and a table of exceptions,
each keyed by a test file of the room or a test function's name (a parametrized case by its full
name, ``test_x[case]``) and giving that file's or test's tier: the most specific entry wins (a
case, then its function, then its file, then the room). A slow test gets the ``slow`` marker here;
a test that carries the marker itself is an error, so that a test's tier is read in one place.
"""
from __future__ import annotations

import os

import pytest

TIERS = ("fast", "slow")


def tier_of(item, room: str, exceptions: dict) -> str:
    name = getattr(item, "originalname", None) or item.name.split("[")[0]
    for key in (item.name, name, os.path.basename(str(item.path))):
        if key in exceptions:
            return exceptions[key]
    return room


def room_tiers(conftest_file: str, room: str, exceptions: dict):
    """The room's ``pytest_collection_modifyitems``: marks its slow tests."""
    folder = os.path.dirname(os.path.abspath(conftest_file))
    for tier in (room, *exceptions.values()):
        if tier not in TIERS:
            raise ValueError(f"{conftest_file}: tier {tier!r} is not one of {TIERS}")

    @pytest.hookimpl(tryfirst=True)  # before -m selects by the marker
    def pytest_collection_modifyitems(items):
        for item in items:
            if os.path.dirname(str(item.path)) != folder:
                continue
            if item.get_closest_marker("slow") is not None:
                raise pytest.UsageError(f"{item.nodeid} marks itself slow: its tier is its room's "
                                        f"({os.path.relpath(conftest_file)}), name it there")
            if tier_of(item, room, exceptions) == "slow":
                item.add_marker(pytest.mark.slow)

    return pytest_collection_modifyitems
