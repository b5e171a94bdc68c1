"""The docs keep their promises: the README opens with the two commands; the trainer guide has every
trainer flag, checks.md a row for every check, DEVELOPMENT.md every make target."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
TRAINER_DOC = REPO / "docs" / "trainer.md"


def trainer_doc() -> str:
    """docs/trainer.md, where the trainer's flag table lives."""
    return TRAINER_DOC.read_text()


def test_opens_with_the_two_commands() -> None:
    first_block = README.split("```")[1]
    assert "make up" in first_block and "make test" in first_block


def test_documents_every_trainer_flag() -> None:
    from trainer.config import build_parser

    flags = [max(a.option_strings, key=len) for a in build_parser()._actions if a.option_strings]
    doc = trainer_doc()
    missing = [f for f in flags if f != "--help" and f"`{f}" not in doc]
    assert not missing, f"trainer flags missing from docs/trainer.md: {missing}"


def test_has_a_row_for_every_check() -> None:
    from orchestrator.contract import CHECK_NAMES

    checks_doc = (REPO / "docs" / "checks.md").read_text()
    missing = [c for c in CHECK_NAMES if not re.search(rf"^\| `{c}` \|", checks_doc, re.M)]
    assert not missing, f"checks without a row in docs/checks.md's table: {missing}"


def test_documents_every_make_target() -> None:
    makefile = (REPO / "Makefile").read_text()
    development = (REPO / "docs" / "DEVELOPMENT.md").read_text()
    targets = re.findall(r"^([a-z-]+):.*## ", makefile, re.M)
    missing = [t for t in targets if f"make {t}" not in development and t != "help"]
    assert not missing, f"Makefile targets missing from docs/DEVELOPMENT.md: {missing}"


def test_no_placeholder_left() -> None:
    assert not re.search(r"^[A-Z_]{6,}$", README, re.M), "a section placeholder is still in the README"


def test_make_help_prints_each_target_as_written() -> None:
    """`make help` greps the `## ` comments: make never expands them, so `$$` there stays `$$`."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=30).stdout
    assert "make clean" in out and "$ORCH_HOME" in out
    assert "$$" not in out, out
