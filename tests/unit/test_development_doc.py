"""The docs hold their budgets, and docs/DEVELOPMENT.md's "files to touch" hold to the tree: each
count is the number of files its `files:` line names, and every path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUDGETS = {"README.md": 250, "docs/guide.md": 500, "docs/DEVELOPMENT.md": 160, "docs/CONTRACT.md": 600}
"""Ceilings in lines: the front door, the user guide (450 before its Slurm section and the chain's
paragraph), the development notes (140 before the recipes
of a container runtime and a job environment), the contract (500 before this round's two new
surfaces, a Slurm allocation and the copy chain, each with guarantees of its own)."""
SECTION = "## Adding things: the files to touch"
HEADING = re.compile(r"^\*\*An? (.+?): (\d+) files?\b", re.M)
PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]*|[\w-]+\.(?:py|md))`")
"""A path in backticks: `dir/`, `dir/file.py`, `README.md` (not `CHECKS` or `ONLY_JOB`)."""


@pytest.mark.parametrize("doc", sorted(BUDGETS))
def test_each_doc_holds_its_budget(doc: str) -> None:
    lines = len((REPO / doc).read_text().splitlines())
    assert lines <= BUDGETS[doc], f"{doc} has {lines} lines, its budget is {BUDGETS[doc]}: move detail to a guide"


def additions(text: str) -> dict[str, tuple[int, list[str], list[str]]]:
    """Each 'how to add' entry: its stated count, the paths of its `files:` line, every path it names."""
    section = text.split(SECTION, 1)[1]
    found = {}
    heads = list(HEADING.finditer(section))
    for m, nxt in zip(heads, [*heads[1:], None]):
        body = section[m.end() : nxt.start() if nxt else len(section)]
        items = re.split(r"^- ", body, flags=re.M)
        counted = next((i for i in items if i.startswith("files: ")), "")
        found[m.group(1)] = (int(m.group(2)), list(dict.fromkeys(PATH.findall(counted))), PATH.findall(body))
    return found


def exists(path: str) -> bool:
    """A path of the tree; `NAME` is the new thing's name, so a sibling of that shape must exist."""
    if "NAME" in path:
        return any((REPO / path).parent.glob(Path(path).name.replace("NAME", "*")))
    return (REPO / path).exists()


def test_the_guard_counts_and_checks_paths() -> None:
    text = (
        f"{SECTION}\n\n**A widget: 2 files** (measured: `abc1234`).\n- files: `orchestrator/contract.py` "
        "(`CHECK_NAMES`), `notes/nowhere.md`,\n  `orchestrator/contract.py`.\n- also `tests/unit/`.\n"
    )
    assert additions(text) == {
        "widget": (
            2,
            ["orchestrator/contract.py", "notes/nowhere.md"],
            ["orchestrator/contract.py", "notes/nowhere.md", "orchestrator/contract.py", "tests/unit/"],
        )
    }
    assert exists("orchestrator/transport/NAME.py") and not exists("orchestrator/nothing/NAME.py")
    assert not exists("notes/nowhere.md")


def test_every_addition_names_as_many_files_as_it_counts_and_each_exists() -> None:
    found = additions((REPO / "docs" / "DEVELOPMENT.md").read_text())
    assert set(found) == {
        "preflight check",
        "transport",
        "container runtime",
        "job environment",
        "CLI command",
        "trainer flag",
        "inventory key",
    }
    for what, (count, files, named) in found.items():
        assert len(files) == count, f"a {what}: {count} files stated, {len(files)} named: {files}"
        missing = [p for p in named if not exists(p)]
        assert not missing, f"a {what}: docs/DEVELOPMENT.md names {missing}, which the tree does not have"
