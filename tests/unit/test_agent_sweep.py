"""`agent.py sweep` (the node side of `orch down`'s container sweep, issue 53 item 3): the listing
and the removal run without a shell, and only the runtime's whole 64-hex IDs are removed, after
`--`; whatever else the listing printed is ignored (and said), never handed to the removal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from orchestrator.node import agent

MINE, THEIRS = "e1" * 32, "0f" * 32


def sweep(capsys: pytest.CaptureFixture[str], listing: list[str], remove: list[str]) -> tuple[int, dict[str, object]]:
    code = agent.main(["sweep", "--spec", json.dumps({"list": listing, "remove": remove})])
    return code, dict(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))


def printer(text: str) -> list[str]:
    return [sys.executable, "-c", f"print({text!r})"]


def recorder(path: Path) -> list[str]:
    return [sys.executable, "-c", "import json, sys; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))", str(path)]


def test_only_whole_ids_are_removed_after_a_double_dash(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    said = tmp_path / "removed.json"
    out = "\n".join([MINE, THEIRS[:12], f"welcome: {THEIRS[:12]} is up", "-f", MINE, "$(touch x)"])
    code, answer = sweep(capsys, printer(out), recorder(said))
    assert code == 0 and answer["containers"] == [MINE] and answer.get("removed") is True, answer
    assert json.loads(said.read_text()) == ["--", MINE]
    assert answer["ignored"] == [THEIRS[:12], f"welcome: {THEIRS[:12]} is up", "-f", "$(touch x)"]


def test_nothing_listed_removes_nothing_and_a_failure_is_said(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    said = tmp_path / "removed.json"
    code, answer = sweep(capsys, printer(""), recorder(said))
    assert (code, answer["containers"], said.exists()) == (0, [], False)
    code, answer = sweep(capsys, [sys.executable, "-c", "import sys; sys.exit('cannot connect')"], recorder(said))
    assert code == 1 and answer["error"] == "cannot list the run's containers: cannot connect"
    code, answer = sweep(capsys, printer(MINE), [sys.executable, "-c", "import sys; sys.exit('in use')"])
    assert code == 1 and f"cannot remove {MINE}: in use" in str(answer["error"])
    code, answer = sweep(capsys, ["/nonexistent/podman"], recorder(said))
    assert code == 1 and "cannot run /nonexistent/podman" in str(answer["error"])
