"""The test files' basenames are unique across tests/: the tiers are plain directories (no
__init__.py), so pytest imports each file by its basename, and a second file of the same name in
another tier fails the whole run's collection ("import file mismatch") once both are collected."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" not in path.parts and "fixtures" not in path.parts:
            where[path.name].append(str(path.relative_to(TESTS)))
    assert where, TESTS
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
