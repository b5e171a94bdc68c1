"""CLI polish: --version, --help with an example everywhere, one-line errors, exit codes, NO_COLOR."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator import __version__
from orchestrator.cli import cli, main

COMMANDS = sorted(cli.commands)
"""Every command of the click group, as `orch --help` lists them: a command added later is tested too."""
CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "CONTRACT.md"


def test_the_group_has_every_command_the_contract_documents_and_no_other() -> None:
    """The derived list is the contract's commands (a group read wrong would make every test
    parametrized by it vanish), and `orch --help` lists each."""
    documented = set(re.findall(r"^\| `orch (?!\[)([a-z]+) ", CONTRACT.read_text(), re.M))
    assert set(COMMANDS) == documented, (COMMANDS, documented)
    listed = CliRunner().invoke(cli, ["--help"]).output
    assert all(re.search(rf"^  {name}\s", listed, re.M) for name in COMMANDS), listed


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_teaches_with_an_example(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and f"orch {command}" in result.output


def test_unknown_run_is_exit_2_with_a_hint_and_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["status", "no-such-run"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "no runs yet" in err or "unknown run" in err
    assert "hint:" in err and "Traceback" not in err


def test_missing_inventory_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    monkeypatch.delenv("ORCH_INVENTORY", raising=False)
    with pytest.raises(SystemExit) as info:
        main(["check"])
    assert info.value.code == 2
    assert "ORCH_INVENTORY" in capsys.readouterr().err


def test_bad_usage_is_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "up", "--no-such-flag"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "no-such-flag" in proc.stderr


def test_no_color_and_pipes_get_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli.ui import color_enabled

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert color_enabled(Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not color_enabled(Tty())
    assert not color_enabled(sys.stdout if not sys.stdout.isatty() else None) or sys.stdout.isatty()


def test_shell_completion_script_is_generated() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()"],
        env={"_ORCH_COMPLETE": "bash_source", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "complete" in proc.stdout and "_ORCH_COMPLETE" in proc.stdout


def test_internal_errors_are_one_line_unless_verbose(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import orchestrator.run.control

    def boom(*args: object, **kwargs: object) -> int:
        raise RuntimeError("something unexpected")

    monkeypatch.setattr(orchestrator.run.control, "status", boom)
    with pytest.raises(SystemExit) as info:
        main(["status"])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert err.strip() == "orch: internal error: RuntimeError: something unexpected (run with -v for the traceback)"
    with pytest.raises(SystemExit):
        main(["-v", "status"])
    assert "Traceback" in capsys.readouterr().err


def test_rich_is_imported_only_where_it_may_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """`may_be_terminal` is False only where rich would not see a terminal either: a tty, or any
    variable that makes rich treat a pipe as one, says True."""
    from orchestrator.cli.ui import console, may_be_terminal

    class Tty:
        def isatty(self) -> bool:
            return True

    class Pipe:
        def isatty(self) -> bool:
            return False

    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)
    assert may_be_terminal(Tty()) and not may_be_terminal(Pipe()) and not may_be_terminal(object())
    monkeypatch.setattr(sys, "stderr", Pipe())
    assert not console(stderr=True).is_terminal
    for var, value in (("FORCE_COLOR", "1"), ("TTY_COMPATIBLE", "1")):
        monkeypatch.setenv(var, value)
        assert may_be_terminal(Pipe()) and console(stderr=True).is_terminal
        monkeypatch.delenv(var)


def test_check_json_in_a_pipe_does_not_import_rich(tmp_path: Path) -> None:
    """`orch check --json` with stdout and stderr piped prints the report without rich; a table
    to a pipe still renders."""
    inv = Path(__file__).resolve().parents[2] / "inventory" / "local.yaml"
    code = (
        "import sys\nfrom orchestrator.cli import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n    print('exit', exc.code, 'rich' in sys.modules, file=sys.stderr)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "ORCH_HOME": str(tmp_path), "HOME": str(tmp_path)}
    args = ["check", str(inv), "--only", "timezone,software"]
    js = subprocess.run(
        [sys.executable, "-c", code, *args, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert js.stderr.strip().splitlines()[-1] == "exit 0 False", js.stderr
    report = json.loads(js.stdout)
    assert report["ok"] and {r["check"] for r in report["results"]} == {"timezone", "software"}
    table = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)
    assert table.stderr.strip().splitlines()[-1] == "exit 0 True", table.stderr
    assert "preflight passed" in table.stdout and "software" in table.stdout


def test_a_long_message_to_a_pipe_stays_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What orch says on stderr is grepped from logs and CI output: a message longer than any
    width (a deep run directory, many nodes) is one line there, never wrapped at a column."""
    from orchestrator.cli import render

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    origin = "/tmp/" + "deep/" * 40 + "check.json"
    render.skew_note({f"gpu{i:02d}": 0.0 for i in range(1, 4)}, origin)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) > 250 and "gpu02 +0.0 ms" in err, err
