"""Each package's `__init__` docstring is a map of its modules: it names every module the package
has, and none it no longer has (a module added, moved or renamed takes its line with it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)
DRIFTED: dict[str, str] = {}
"""Packages whose map is known not to hold yet, with why: the test fails once it holds (strict xfail)."""


def named(doc: str) -> set[str]:
    """The modules (`name.py`) and subpackages (`name/`) a docstring names on their own, not as a
    path into another package (`node/probe.py`)."""
    return set(re.findall(r"(?<![\w/.])`(\w+\.py|\w+/)`", doc))


def present(package: Path) -> set[str]:
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    return modules | {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}


def test_names_are_read_as_written() -> None:
    doc = (
        "- `agents.py` ship; `jobs/` the jobs; not `node/probe.py`, `x.pyi`, `ssh.openssh_argv` or `orchestrator/up.py`"
    )
    assert named(doc) == {"agents.py", "jobs/"}


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=DRIFTED[p.name])) if p.name in DRIFTED else p
        for p in PACKAGES
    ],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_package_docstring_names_exactly_its_modules(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    missing, gone = present(package) - named(doc), named(doc) - present(package)
    assert (missing, gone) == (set(), set()), (
        f"{package.relative_to(PACKAGE)}/__init__.py: not named {sorted(missing)}, no such module {sorted(gone)}"
    )
