"""Nothing a node sends reaches the terminal raw: log lines (stored and live), check values and
details, failure excerpts, `orch status`, errors that quote a node. Control characters are shown
escaped; the copies keep the bytes, `--json` escapes them, `orch logs --raw` writes them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import render
from orchestrator.logs.lines import LogLine, format_line, format_ts, printable, to_json
from orchestrator.store import remote_dir
from tests.logs_support import make_run

T0 = 1_796_031_125.0
# what a hostile or careless job prints: a window title (OSC), clear screen, cursor report,
# an 8-bit CSI (C1, U+009B), a right-to-left override, BEL, DEL, a CR redraw; and an SGR colour
EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[6n\x9b31m\u202egnp.exe\x7f [link=https://x.example]click[/link]"
RED = "\x1b[31mred\x1b[0m"
REPO = Path(__file__).resolve().parents[2]


def terminal_acting(text: str) -> list[str]:
    """The characters of text a terminal would act on (C0 but TAB/newline, DEL, C1, bidi)."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F
            or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 or c in "\u200e\u200f"]


def test_printable_escapes_controls_visibly_and_keeps_tab_and_text() -> None:
    assert printable("plain text: ok é 字 █") == "plain text: ok é 字 █"
    assert printable("a\tb") == "a\tb"
    assert printable(EVIL) == ("\\x1b]0;owned\\x07\\x1b[2J\\x1b[6n\\x9b31m\\u202egnp.exe\\x7f "
                               "[link=https://x.example]click[/link]")
    assert printable("50%\r") == "50%\\r"
    assert printable("\x00\x08\x0b\x0c\x1f\x85\u200e\u200f\u2066\u2069") == (
        "\\x00\\x08\\x0b\\x0c\\x1f\\x85\\u200e\\u200f\\u2066\\u2069")
    # with colour on a terminal the job's colours stay, and only if exactly SGR
    assert printable(RED + "\x1b[2J\x1b[38;5;9m!", sgr=True) == RED + "\\x1b[2J\x1b[38;5;9m!"
    assert printable(RED) == "\\x1b[31mred\\x1b[0m"
    assert printable("\x1b[1;2H\x1b[?25l\x1b[31;m", sgr=True) == "\\x1b[1;2H\\x1b[?25l\x1b[31;m"


def line(text: str, stream: str = "out") -> LogLine:
    return LogLine(T0, "n1", 0, 0, 0, stream, text)


def test_format_line_escapes_unless_raw_and_keeps_only_sgr_with_colour() -> None:
    plain = format_line(line(EVIL), False)
    assert terminal_acting(plain) == [] and "\\x1b]0;owned" in plain
    assert format_line(line(EVIL), False, raw=True).endswith(EVIL)
    coloured = format_line(line(RED + " then \x1b]0;t\x07"), True)
    assert RED in coloured and "\\x1b]0;t\\x07" in coloured and "\x07" not in coloured
    assert coloured.endswith("\x1b[0m")  # the job's colour ends with its line
    # a progress bar redrawn with CR shows its last state; no CR is left to move the cursor
    assert format_line(line("10%\r20%\r"), False).endswith(" r0 20%")


def test_json_keeps_the_text_and_escapes_every_control() -> None:
    out = to_json(line(EVIL + "\u0085"))
    assert json.loads(out)["line"] == EVIL + "\u0085"
    assert terminal_acting(out) == [], out


def test_check_table_status_outcome_and_errors_show_node_text_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.preflight.checks import CheckResult
    from orchestrator.preflight.runner import CheckReport
    from orchestrator.run.control import NodeReport, StatusReport
    from orchestrator.run.supervise import Failure
    from orchestrator.up import UpOutcome

    buf = io.StringIO()
    report = CheckReport([CheckResult("software", "n1", "fail", EVIL, "torch " + EVIL, "fix " + EVIL)])
    from rich.console import Console

    render.check_table(report, Console(file=buf, force_terminal=True, width=300))
    table = buf.getvalue()
    # the table's own colours are there (a terminal), the node's escapes are not
    assert "\x1b[" in table and "owned" in table and "\x1b]0;" not in table and "\x9b" not in table
    assert "\u202e" not in table and "\x07" not in table and "[link=https://x.example]" in table
    assert "\x1b]8;" not in table  # no hyperlink made of the node's text
    render.status_table(StatusReport("r1", "failed", [NodeReport("n1", 0, "h", "unreachable", None, None, None,
                                                                 None, None, None, None, "ssh: " + EVIL)],
                                     {"node": "n1", "rank": 0, "exit_code": 1, "reason": EVIL}))
    render.up_outcome(UpOutcome("failed", "r1", failure=Failure("n1", 0, "exit " + EVIL, 1, 0, 0, [EVIL, "ok"])))
    render.orch_error("n1: the node agent failed: " + EVIL, "hint " + EVIL)
    out = capsys.readouterr()
    for text in (out.out, out.err):
        assert terminal_acting(text) == [], text
    assert out.err.count("\\x1b]0;owned") == 4 and "orch: n1: the node agent failed: \\x1b]0;owned" in out.err
    assert "ssh: \\x1b]0;owned" in out.out


def test_orch_logs_escapes_by_default_raw_writes_the_bytes_json_keeps_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    os.environ["ORCH_HOME"] = str(home)
    try:
        inv, run = make_run(tmp_path, ["n1"], nproc=1)
    finally:
        del os.environ["ORCH_HOME"]
    node_dir = Path(os.path.expanduser(remote_dir(inv, inv.nodes[0], run.run_id)))
    node_dir.mkdir(parents=True)
    text = f"{format_ts(T0)} out [default0]:{EVIL}\n{format_ts(T0 + 1)} err {RED}\n"
    (node_dir / "node.log").write_text(text)
    (node_dir / "state.json").write_text('{"state": "succeeded"}')
    env = dict(os.environ, ORCH_HOME=str(home), NO_COLOR="1")

    def logs(*args: str, pure: bool = False) -> subprocess.CompletedProcess[bytes]:
        e = dict(env, ORCH_PURE_PYTHON="1") if pure else env
        return subprocess.run([sys.executable, "-m", "orchestrator", "logs", run.run_id, *args], cwd=REPO, env=e,
                              capture_output=True, timeout=120)

    for pure in (False, True):  # the C merge and the Python one
        out = logs(pure=pure)
        assert out.returncode == 0, out.stderr
        shown = out.stdout.decode()
        assert terminal_acting(shown) == [] and "\\x1b]0;owned\\x07" in shown and "\\x1b[31mred" in shown
        merged = run.merged_log.read_text()
        assert merged == shown  # merged.log holds what orch logs prints: cat-ing it is as safe
    raw = logs("--raw").stdout.decode()
    assert EVIL in raw and RED in raw
    assert logs("--raw", "--node", "n1").stdout.decode() == raw  # the general path agrees
    filtered = logs("--grep", "owned").stdout.decode()
    assert terminal_acting(filtered) == [] and "owned" in filtered
    js = logs("--json").stdout.decode()
    assert terminal_acting(js) == [] and [json.loads(x)["line"] for x in js.splitlines()] == [EVIL, RED]
    both = logs("--raw", "--json")
    assert both.returncode == 2 and b"--raw and --json" in both.stderr
    # the node's copy keeps every byte as written
    assert (run.path / "nodes" / "n1.log").read_text() == text
