"""Issue #25, the conventions users bring: state found from any shell (`~/.orch`), `orch runs`,
run id prefixes and `latest`, overrides on the command line, and the report's summary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.store import orch_home


def test_orch_home_defaults_to_the_users_home_not_the_current_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`orch logs -f` from another shell in another directory finds the same runs (SkyPilot's ~/.sky)."""
    monkeypatch.delenv("ORCH_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    assert orch_home() == tmp_path / "user" / ".orch"
    monkeypatch.setenv("ORCH_HOME", "~/elsewhere")
    assert orch_home() == tmp_path / "user" / "elsewhere"
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "explicit"))
    assert orch_home() == tmp_path / "explicit"


def test_a_test_that_asks_for_no_home_never_reaches_the_real_one() -> None:
    """The conftest guard: every test (and every orch it starts) has a private $ORCH_HOME."""
    home = orch_home()
    assert home != Path("~/.orch").expanduser()
    assert Path(os.environ["ORCH_HOME"]) == home
    assert "test_a_test_that_asks_for_no_home" in home.name
