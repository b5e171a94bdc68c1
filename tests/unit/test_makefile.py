"""`make help` is the list of what make can do: every target has its `## ` line and is shown."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text()
TARGETS = re.findall(r"^([a-z][\w-]*):(?!=)", MAKEFILE, re.M)
"""The Makefile's own targets (not file rules like `$(STAMP):`, not variables like `SHELL :=`)."""


def test_the_targets_are_found() -> None:
    assert {"help", "install", "up", "test", "test-fast", "lint", "clean"} <= set(TARGETS)
    assert len(TARGETS) == len(set(TARGETS)), TARGETS


def test_every_target_has_help_text() -> None:
    helped = set(re.findall(r"^([a-z][\w-]*):.*## \S", MAKEFILE, re.M))
    assert [t for t in TARGETS if t not in helped] == []


def test_every_target_is_phony() -> None:
    """A target that names no file is .PHONY: else a file of that name would make it do nothing."""
    phony = re.search(r"^\.PHONY:(.*)$", MAKEFILE, re.M)
    assert phony is not None and sorted(phony.group(1).split()) == sorted(TARGETS)


def test_make_help_lists_every_target() -> None:
    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=30).stdout
    shown = re.findall(r"^  make (\S+)", out, re.M)
    assert shown == TARGETS, out


def _ci_make_targets() -> list[str]:
    return re.findall(r"^make (\S+)", (REPO / ".ci" / "run").read_text(), re.M)


def test_ci_lints_as_well_as_tests() -> None:
    """CI runs `make lint` (ruff and mypy) before the suite: a lint error fails the landing."""
    assert _ci_make_targets() == ["lint", "test"]


def test_the_pre_commit_hooks_run_what_ci_runs() -> None:
    """.pre-commit-config.yaml runs CI's lint target and the inner loop (the whole suite is too long
    for a commit hook), through make, so the commands are written once, in the Makefile."""
    import yaml

    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = [h for repo in config["repos"] for h in repo["hooks"]]
    entries = [h["entry"] for h in hooks]
    assert entries == ["make lint", "make test-fast"], entries
    assert all(h["language"] == "system" and h["pass_filenames"] is False for h in hooks), hooks
    assert {e.split()[1] for e in entries} <= set(TARGETS) & {*_ci_make_targets(), "test-fast"}
