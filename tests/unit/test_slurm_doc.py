"""docs/slurm.md's table of the fifteen Slurm pitfalls: each row names the tests that hold orch to
it, and each of those tests exists (a renamed or deleted test fails here, not silently in a doc)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "slurm.md"


def rows() -> list[tuple[int, str]]:
    """(pitfall number, its "Held by" cell) of every row of the table."""
    out = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| (\d+) \|", line)
        if m:
            out.append((int(m.group(1)), line.rstrip(" |").rsplit(" | ", 1)[1]))
    return out


def functions_in(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_every_pitfall_has_a_row_that_names_a_test() -> None:
    table = rows()
    assert [n for n, _ in table] == list(range(1, 16))
    assert all(re.search(r"`tests/\S+\.py::test_\w+`", held) for _, held in table), table


def test_every_test_the_table_names_exists() -> None:
    named = [ref for _, held in rows() for ref in re.findall(r"`(tests/\S+\.py)::(test_\w+)`", held)]
    missing = [f"{path}::{name}" for path, name in named if name not in functions_in(REPO / path)]
    assert named and missing == []
