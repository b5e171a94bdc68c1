"""Every reference resolves: links between the docs (and their anchors), and the docs the code cites."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIPPED = {"build", "dist", "data", "runs", "node_modules"}
"""Folders of what is built or run, not written: their .md files are not the repo's (like the
hidden ones: .venv, .pytest_cache, .orch)."""
DOCS = sorted(
    p
    for p in REPO.rglob("*.md")
    if not any(d.startswith(".") or d in SKIPPED or d.endswith(".egg-info") for d in p.relative_to(REPO).parts[:-1])
)
"""Every .md file of the repo: README.md, docs/, inventory/, bench/, tests/fixtures/..."""
LINK = re.compile(
    r"\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)"  # [text](target "title")
    r"|^\s{0,3}\[[^\]]+\]:\s+<?([^\s>]+)"  # [label]: target
    r"|<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"",
    re.M,
)  # <a href="...">, <img src="...">
FENCE = re.compile(r"^\s*(```|~~~).*?^\s*\1", re.M | re.S)
CODE = re.compile(r"(`+)[^`].*?\1")


def prose(text: str) -> str:
    """A document without its code (fenced blocks and `spans`): what looks like a link or a
    heading there is code, not one."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated heading's second anchor is `-1`, its third `-2`, as GitHub
    numbers them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for m in re.finditer(r"^#+ (.+?)(?:\s+#+)?$", FENCE.sub("", path.read_text()), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(doc: Path) -> list[str]:
    """The relative links of a markdown file whose file, or #anchor in a markdown file, is not there."""
    broken = []
    for groups in LINK.findall(prose(doc.read_text())):
        target = next(g for g in groups if g)
        if re.match(r"[a-z][a-z+.-]*:", target):
            continue  # https://, mailto:
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    return broken


def test_every_markdown_file_of_the_repo_is_checked() -> None:
    names = {str(p.relative_to(REPO)) for p in DOCS}
    assert {
        "README.md",
        "docs/CONTRACT.md",
        "inventory/README.md",
        "bench/README.md",
        "tests/fixtures/README.md",
    } <= names
    assert not any(n.startswith(".") for n in names)


def test_the_guard_sees_broken_links_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## Setup\n\n## Setup\n\n```sh\n# not a heading\n```\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Here\n[a](other.md) [b](other.md#setup-1) [c](#here) [d](https://x.org/none) "
        "[e](missing.md) [f](other.md#setup-2) [g](other.md#not-a-heading) `[h](in-code.md)`\n"
        '[label]: gone.md\n<a href="other.md#nowhere">i</a> <img src="pic.png">\n'
        "```\n[j](in-a-fence.md)\n```\n"
    )
    assert broken_links(doc) == [
        "missing.md",
        "other.md#setup-2",
        "other.md#not-a-heading",
        "gone.md",
        "other.md#nowhere",
        "pic.png",
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_between_the_docs_resolve(doc: Path) -> None:
    broken = broken_links(doc)
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"


def test_the_docs_the_code_cites_exist() -> None:
    cited = set()
    for path in [*(REPO / "orchestrator").rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        cited |= set(re.findall(r"\b((?:docs|inventory)/[A-Za-z_]+\.md)\b", path.read_text()))
    assert {"docs/CONTRACT.md", "docs/ARCHITECTURE.md"} <= cited
    assert [c for c in sorted(cited) if not (REPO / c).exists()] == []


def test_no_bare_contract_reference_is_left() -> None:
    """CONTRACT.md is docs/CONTRACT.md: a bare name in code would point nowhere from the source tree."""
    bare = [
        f"{p.relative_to(REPO)}"
        for p in (REPO / "orchestrator").rglob("*.py")
        if re.search(r"(?<!docs/)\bCONTRACT\.md", p.read_text())
    ]
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
