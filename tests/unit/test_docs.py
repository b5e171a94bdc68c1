"""Every reference resolves: links between the docs (and their anchors), and the docs the code cites."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "inventory" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_between_the_docs_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https://, mailto:
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"


def test_the_docs_the_code_cites_exist() -> None:
    cited = set()
    for path in [*(REPO / "orchestrator").rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        cited |= set(re.findall(r"\b((?:docs|inventory)/[A-Za-z_]+\.md)\b", path.read_text()))
    assert {"docs/CONTRACT.md", "docs/ARCHITECTURE.md"} <= cited
    assert [c for c in sorted(cited) if not (REPO / c).exists()] == []


def test_no_bare_contract_reference_is_left() -> None:
    """CONTRACT.md is docs/CONTRACT.md: a bare name in code would point nowhere from the source tree."""
    bare = [f"{p.relative_to(REPO)}" for p in (REPO / "orchestrator").rglob("*.py")
            if re.search(r"(?<!docs/)\bCONTRACT\.md", p.read_text())]
    assert bare == []
