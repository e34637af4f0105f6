"""`make test`'s scheduler deals the longest scopes first (tests/conftest.py): the queue xdist deals
from is reordered by expected seconds, a scope not in the table counting 2 s per test."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from conftest import SCOPE_SECONDS, SHARED_MODEL_GROUPS, longest_first


def queue(*scopes: tuple[str, int]) -> OrderedDict:
    return OrderedDict((scope, {f"{scope}::t{i}": False for i in range(tests)}) for scope, tests in scopes)


def test_the_longest_scopes_are_dealt_first():
    work = queue(("test_many_quick", 40), ("test_cli", 5), ("qwen-0.5b-fp32", 3), ("test_new", 30))
    before = dict(work)
    longest_first(work)
    assert list(work) == ["qwen-0.5b-fp32", "test_cli", "test_many_quick", "test_new"]
    assert dict(work) == before  # every scope keeps every one of its tests: only the order moved


def test_the_table_names_only_scopes_that_exist():
    """A renamed module would silently fall back to its test count: the table must name real scopes."""
    modules = {path.stem for path in Path(__file__).parent.glob("test_*.py")}
    unknown = set(SCOPE_SECONDS) - modules - set(SHARED_MODEL_GROUPS)
    assert not unknown, f"SCOPE_SECONDS names scopes that no longer exist: {sorted(unknown)}"
