"""`make test`'s scheduler deals the longest scopes first (tests/conftest.py): the queue xdist deals
from is reordered by expected seconds, a scope not in the table counting 2 s per test."""

from __future__ import annotations

from collections import OrderedDict

from conftest import SCOPE_SECONDS, longest_first


def queue(*scopes: tuple[str, int]) -> OrderedDict:
    return OrderedDict((scope, {f"{scope}::t{i}": False for i in range(tests)}) for scope, tests in scopes)


def test_the_longest_scopes_are_dealt_first():
    work = queue(("test_many_quick", 40), ("test_cli", 5), ("qwen-0.5b-fp32", 3), ("test_new", 30))
    longest_first(work)
    assert list(work) == ["qwen-0.5b-fp32", "test_cli", "test_many_quick", "test_new"]
    assert all(len(units) for units in work.values())  # control: nothing dropped on the way


def test_the_table_names_only_scopes_that_exist():
    """A renamed module would silently fall back to its test count: the table must name real scopes."""
    from pathlib import Path

    from conftest import SHARED_MODEL_GROUPS

    modules = {path.stem for path in Path(__file__).parent.glob("test_*.py")}
    unknown = set(SCOPE_SECONDS) - modules - set(SHARED_MODEL_GROUPS)
    assert not unknown, f"SCOPE_SECONDS names scopes that no longer exist: {sorted(unknown)}"
