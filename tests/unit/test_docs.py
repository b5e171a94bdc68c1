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


def test_the_modules_the_code_names_exist() -> None:
    """A docstring or comment that names `orchestrator.x.y` or a file `part/module.py` points at
    something real: a module moved or renamed takes its mentions with it."""
    import importlib.util

    missing = []
    sources = [*(REPO / "orchestrator").rglob("*.py"), *(REPO / "trainer").rglob("*.py")]
    for path in sources:
        text = path.read_text()
        for dotted in set(re.findall(r"\borchestrator(?:\.[a-z_]+)+", text)):
            parts = dotted.split(".")
            while len(parts) > 1 and importlib.util.find_spec(".".join(parts)) is None:
                parts.pop()  # `orchestrator.node.program`: a module, then an attribute of it
            if len(parts) == 1 and dotted != "orchestrator":
                missing.append(f"{path.relative_to(REPO)}: {dotted}")
        for name in set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", text)):
            here = [REPO / name, REPO / "orchestrator" / name, path.parent / name, path.parent.parent / name]
            if not any(p.exists() for p in here):
                missing.append(f"{path.relative_to(REPO)}: {name}")
    assert missing == []
