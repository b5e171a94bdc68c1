"""`orch exec`: each node's answer and exit code, grouping, the worst code, safe rendering, the CLI.

The command line runs against `transport: local` nodes (processes on this machine); over real
sshd nodes: tests/integration/test_exec_ssh.py.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main, render
from orchestrator.errors import TransportError
from orchestrator.remote.exec import (
    TIMED_OUT,
    UNREACHABLE,
    ExecReport,
    NodeOutput,
    command_line,
    node_output,
    tether,
    timed_line,
)
from orchestrator.transport import Result

REPO = Path(__file__).resolve().parents[2]


def result(code: int, out: str = "", err: str = "") -> Result:
    return Result("n1", ("x",), code, out, err, 12.0)


# ----------------------------------------------------------------------------- exit codes


def test_a_command_keeps_its_own_exit_code_and_output() -> None:
    got = node_output("n1", result(3, "out\n", "err\n"))
    assert (got.exit_code, got.stdout, got.stderr, got.error) == (3, "out\n", "err\n", None)


def test_no_exit_status_over_ssh_counts_as_255() -> None:
    got = node_output("n1", result(-1, "partial"))
    assert got.exit_code == UNREACHABLE == 255
    assert got.stdout == "partial" and got.error and "without an exit status" in got.error


def test_a_local_process_killed_by_a_signal_counts_128_plus_n() -> None:
    got = node_output("n1", result(-9))
    assert got.exit_code == 137 and got.error == "killed by signal 9"


def test_unreachable_is_255_with_the_transport_hint_and_timeout_124() -> None:
    down = node_output("n1", TransportError("n1", "unreachable", "connection to root@h:22 refused", "start sshd"))
    assert (down.exit_code, down.error, down.hint) == (255, "connection to root@h:22 refused", "start sshd")
    slow = node_output("n1", TransportError("n1", "timeout", "command timed out after 2 s"))
    assert (slow.exit_code, slow.error) == (TIMED_OUT, "command timed out after 2 s")
    odd = node_output("n1", RuntimeError("boom"))
    assert (odd.exit_code, odd.error) == (255, "RuntimeError: boom")


def report(*answers: tuple[str, int, str]) -> ExecReport:
    return ExecReport(("date",), True, tuple(NodeOutput(n, code, out, "") for n, code, out in answers))


def test_with_a_timeout_the_node_runs_the_command_under_timeout_1() -> None:
    """Every value reaches the node's /bin/sh as a positional parameter: the python, the program,
    the limits and the command are words after the script, never inside it."""
    watcher = tether("python3")
    assert (
        watcher.startswith(
            '/bin/sh -c \'command -v "$0" >/dev/null 2>&1 && { "$0" -I -S -c "$1" "$PPID" '
            "</dev/null >/dev/null 2>&1 & }' python3 'import base64,zlib;exec(zlib.decompress(base64.b64decode(\""
        )
        and watcher.endswith("\")))'; ")
        and "\n" not in watcher
    )
    guard = 'command -v "$0" >/dev/null 2>&1 || { echo "orch: $0 is not installed on this node" >&2; exit 127; }; '
    assert timed_line(["sleep", "30"], False, 2) == (
        f"{watcher}exec /bin/sh -c "
        + shlex.quote(guard + 'k=$1 t=$2; shift 2; exec "$0" -k "$k" "$t" "$@"')
        + " timeout 5 2 sleep 30"
    )
    assert " /opt/venv/bin/python 'import base64" in timed_line(["sleep", "30"], False, 2, "/opt/venv/bin/python")
    assert timed_line(["sleep", "30"], False, 2, None).startswith("exec /bin/sh -c ")  # untethered
    assert command_line(["df -h | grep x"], True, "python3") == watcher + "df -h | grep x"
    assert timed_line(["df -h | grep '/data'"], True, 2.5).endswith(
        """-c "$3"' timeout 5 2.5 'df -h | grep '"'"'/data'"'"''"""
    )
    assert timed_line(["echo", "$HOME", "a b"], False, 1).endswith(" timeout 5 1 echo '$HOME' 'a b'")


def test_the_timed_line_runs_under_a_real_sh(tmp_path: Path) -> None:
    """The positional parameters reach timeout(1) as they are, in both forms; without timeout(1)
    the one guard names it and exits 127."""
    argv = subprocess.run(
        ["/bin/sh", "-c", timed_line(["printf", "%s|", "$HOME", "a b", "'q'"], False, 30, None)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (argv.returncode, argv.stdout) == (0, "$HOME|a b|'q'|")
    line = subprocess.run(
        ["/bin/sh", "-c", timed_line(['echo "$0" | tr a-z A-Z; exit 4'], True, 30, None)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SHELL": "/bin/sh"},
    )
    assert (line.returncode, line.stdout) == (4, "/BIN/SH\n")
    bare = tmp_path / "bin"
    bare.mkdir()
    gone = subprocess.run(
        ["/bin/sh", "-c", timed_line(["true"], True, 30, None)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bare)},
    )
    assert (gone.returncode, gone.stderr) == (127, "orch: timeout is not installed on this node\n")


def test_timeout_1_stopping_the_command_is_124_with_the_output_so_far() -> None:
    late = Result("n1", ("x",), 124, "partial\n", "", 2001.0)
    got = node_output("n1", late, timeout=2)
    assert (got.exit_code, got.stdout) == (124, "partial\n")
    assert got.error == "timed out after 2 s: its process group on the node was stopped (SIGTERM)"
    killed = node_output("n1", Result("n1", ("x",), 137, "", "", 7100.0), timeout=2)
    assert killed.exit_code == 124 and "SIGKILL, 5 s after SIGTERM" in (killed.error or "")
    # the command's own 124 (or 137), in time, is its own
    assert node_output("n1", Result("n1", ("x",), 124, "", "", 50.0), timeout=2).error is None
    assert node_output("n1", Result("n1", ("x",), 137, "", "", 50.0), timeout=2).exit_code == 137
    # the controller's backstop: the node did not answer long after its timeout(1) should have
    gone = node_output("n1", TransportError("n1", "timeout", "command timed out after 17 s"), timeout=2)
    assert gone.exit_code == 124 and "the command may still run there" in (gone.error or "") and gone.hint


def test_worst_is_the_largest_exit_code() -> None:
    assert report(("a", 0, ""), ("b", 0, "")).exit_code == 0
    assert report(("a", 2, ""), ("b", 1, ""), ("c", 0, "")).exit_code == 2
    assert report(("a", 124, ""), ("b", 255, ""), ("c", 1, "")).exit_code == 255


def test_identical_answers_group_in_order_of_their_first_node() -> None:
    r = report(("n1", 0, "x\n"), ("n2", 1, "x\n"), ("n3", 0, "x\n"), ("n4", 0, "y\n"), ("n5", 0, "x\n"))
    assert [(g.nodes, g.answer.exit_code, g.answer.stdout) for g in r.groups()] == [
        (("n1", "n3", "n5"), 0, "x\n"),
        (("n2",), 1, "x\n"),
        (("n4",), 0, "y\n"),
    ]
    assert [n.node for n in r.failed()] == ["n2"]


def test_json_has_every_node_with_its_code_streams_and_error() -> None:
    r = ExecReport(
        ("df", "-h"),
        False,
        (NodeOutput("n1", 0, "ok\n", "", elapsed_ms=3.14159), NodeOutput("n2", 255, "", "", "refused", "start sshd")),
    )
    assert r.to_json() == {
        "command": ["df", "-h"],
        "shell": False,
        "exit_code": 255,
        "nodes": [
            {
                "node": "n1",
                "exit_code": 0,
                "stdout": "ok\n",
                "stderr": "",
                "error": None,
                "hint": None,
                "elapsed_ms": 3.1,
                "stdout_dropped": 0,
                "stderr_dropped": 0,
            },
            {
                "node": "n2",
                "exit_code": 255,
                "stdout": "",
                "stderr": "",
                "error": "refused",
                "hint": "start sshd",
                "elapsed_ms": None,
                "stdout_dropped": 0,
                "stderr_dropped": 0,
            },
        ],
    }


# ----------------------------------------------------------------------------- rendering


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),
        ("100%\rdone", "100%\\rdone"),
        ("a\x00b\x7fc\x9bd", "a\\x00b\\x7fc\\x9bd"),
        ("user\u202egnp.exe", "user\\u202egnp.exe"),
        ("tab\tand\nnewline, é, 中文", "tab\tand\nnewline, é, 中文"),
    ],
)
def test_printable_escapes_control_characters_but_tab_and_newline(raw: str, shown: str) -> None:
    assert render.printable(raw) == shown


def test_output_is_grouped_like_dshbak_with_failures_named(capsys: pytest.CaptureFixture[str]) -> None:
    r = ExecReport(
        ("x",),
        True,
        (
            NodeOutput("node1", 0, "same\n", ""),
            NodeOutput("node2", 0, "same\n", ""),
            NodeOutput("node3", 2, "", "ls: no such file\n"),
            NodeOutput("node5", 0, "same\n", ""),
            NodeOutput("node4", 255, "", "", "connection refused", "start sshd"),
            NodeOutput("node6", 0, "\x1b]0;pwned\x07no newline", ""),
        ),
    )
    render.exec_output(r, color=False)
    out, err = capsys.readouterr()
    assert out == (
        "----------------\nnode[1-2,5] (3)\n----------------\nsame\n"
        "----------------\nnode3 (1): exit 2\n----------------\nls: no such file\n"
        "----------------\nnode4 (1): connection refused (exit 255)\n----------------\n"
        "hint: start sshd\n"
        "----------------\nnode6 (1)\n----------------\n\\x1b]0;pwned\\x07no newline\n"
    )
    assert err == "orch exec: 2 of 6 nodes failed (exit 255: node4; exit 2: node3)\n"


# ----------------------------------------------------------------------------- the command line


@pytest.fixture
def local_inv(tmp_path: Path) -> Path:
    inv = tmp_path / "local.yaml"
    inv.write_text(
        yaml.safe_dump({"name": "lx", "transport": "local", "nodes": [{"host": "localhost", "name": "n[0-2]"}]})
    )
    return inv


def orch(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    code = info.value.code
    assert isinstance(code, int)
    return code, out, err


def test_the_command_goes_after_dashes(local_inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = orch(["exec", str(local_inv), "date"], capsys)
    assert code == 2 and out == ""
    assert "orch: put the command after --" in err and "orch exec [INVENTORY]" in err
    code, _, err = orch(["exec", str(local_inv), "--"], capsys)
    assert code == 2 and "orch: no command given" in err


def test_an_unknown_node_runs_nothing(local_inv: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code, _, err = orch(["exec", str(local_inv), "--nodes", "n[2-3]", "--", "touch", str(marker)], capsys)
    assert code == 2 and "no node named n3" in err and "n[0-2]" in err
    assert not marker.exists()


def test_words_after_dashes_are_the_command_options_included(
    local_inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = orch(
        ["exec", str(local_inv), "--json", "--nodes", "n[0-1]", "--", "printf", "%s|", "--json", "a b", "$HOME", ";"],
        capsys,
    )
    doc = json.loads(out)
    assert code == 0 and doc["shell"] is False
    assert [(n["node"], n["stdout"], n["exit_code"]) for n in doc["nodes"]] == [
        ("n0", "--json|a b|$HOME|;|", 0),
        ("n1", "--json|a b|$HOME|;|", 0),
    ]


def test_one_word_is_a_shell_line_and_the_exit_code_is_the_worst(
    local_inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = 'echo "$(echo piped | tr a-z A-Z)"; case $ORCH_EXEC_T in *) exit 3;; esac'
    code, out, err = orch(["exec", str(local_inv), "-b", "--", line], capsys)
    assert code == 3
    assert out == "----------------\nn[0-2] (3): exit 3\n----------------\nPIPED\n"
    assert "3 of 3 nodes failed (exit 3: n[0-2])" in err


def test_timeout_counts_124(local_inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = orch(["exec", str(local_inv), "--timeout", "0.5", "--json", "--", "sleep 30"], capsys)
    doc = json.loads(out)
    assert code == 124
    assert {n["exit_code"] for n in doc["nodes"]} == {124}
    assert all("timed out" in n["error"] for n in doc["nodes"])


def test_ctrl_c_stops_waiting_and_exits_130(local_inv: Path, tmp_path: Path) -> None:
    env = {**os.environ, "ORCH_HOME": str(tmp_path / "home")}
    started = tmp_path / "started"
    started.mkdir()
    line = f"mktemp -p {started} >/dev/null && exec sleep 120"  # each node says it runs, then waits
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "exec", str(local_inv), "--", line],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while len(list(started.iterdir())) < 3:  # the command runs on every node: Ctrl-C now interrupts it
        assert proc.poll() is None and time.monotonic() < deadline, "orch exec never ran the command everywhere"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)  # far less than the command's 120 s
    assert proc.returncode == 130, err
    assert "interrupted" in err


# ----------------------------------------------------------------------------- live output (pdsh, clush)


def test_each_line_is_shown_as_it_arrives_not_once_every_node_finished(local_inv: Path, tmp_path: Path) -> None:
    """Each node's command waits for a file that is only made once its first line was seen: with
    output held back until the end, no command could finish (and the run would time out)."""
    from orchestrator.config import inventory
    from orchestrator.remote.exec import run_everywhere

    inv = inventory.load(local_inv)
    seen: list[tuple[str, str, str]] = []

    def on_line(node: str, stream: str, line: str) -> None:
        seen.append((node, stream, line))
        if line == "ready":
            (tmp_path / f"go-{node}").touch()

    names = [n.name for n in inv.nodes]
    for node in inv.nodes:  # local nodes are all this machine: one at a time, each its own file
        line = f"echo ready; while [ ! -e {tmp_path}/go-{node.name} ]; do sleep 0.02; done; echo gone >&2; printf tail"
        report = run_everywhere(inv, [node], [line], timeout=30, on_line=on_line)
        assert report.exit_code == 0, report.to_json()
        assert report.nodes[0].stdout == report.nodes[0].stderr == ""  # handed on as it came, not kept
    assert seen == [x for n in names for x in ((n, "out", "ready"), (n, "err", "gone"), (n, "out", "tail"))]


def test_live_output_is_node_colon_line_on_the_stream_it_came_from(
    local_inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = orch(
        ["exec", str(local_inv), "--", "echo one; echo two >&2; printf '\\033[2Jthree'; exit 4"], capsys
    )
    assert code == 4
    assert sorted(out.splitlines()) == sorted([f"n{i}: {t}" for i in range(3) for t in ("one", "\\x1b[2Jthree")])
    for i in range(3):  # one node's lines in order
        mine = [line for line in out.splitlines() if line.startswith(f"n{i}: ")]
        assert mine == [f"n{i}: one", f"n{i}: \\x1b[2Jthree"]
    assert sorted(line for line in err.splitlines() if line.startswith("n")) == ["n0: two", "n1: two", "n2: two"]
    assert "3 of 3 nodes failed (exit 4: n[0-2])" in err


def test_env_is_set_for_the_command_argv_or_shell_line(local_inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = orch(
        [
            "exec",
            str(local_inv),
            "--json",
            "--nodes",
            "n0",
            "--env",
            "A=x y",
            "--env",
            "B=2",
            "--",
            "sh",
            "-c",
            'echo "$A|$B"',
        ],
        capsys,
    )
    assert code == 0 and json.loads(out)["nodes"][0]["stdout"] == "x y|2\n"
    code, out, _ = orch(
        ["exec", str(local_inv), "--json", "--nodes", "n0", "--env", "A=x y", "--", 'echo "$A"'], capsys
    )
    assert code == 0 and json.loads(out)["nodes"][0]["stdout"] == "x y\n"
    code, _, err = orch(["exec", str(local_inv), "--env", "A=$(id)", "--", "true"], capsys)
    assert code == 2 and "--env A" in err


def test_w_names_hosts_without_an_inventory_with_ssh_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.config.inventory import adhoc

    inv = adhoc("gpu[1-3],root@login")
    assert [(n.name, n.host, n.ssh.user) for n in inv.nodes] == [
        ("gpu1", "gpu1", None),
        ("gpu2", "gpu2", None),
        ("gpu3", "gpu3", None),
        ("login", "login", "root"),
    ]
    assert inv.transport == "ssh" and {n.ssh.host_key_policy for n in inv.nodes} == {"strict"}
    assert {n.ssh.ssh_config for n in inv.nodes} == {"~/.ssh/config"}
    assert adhoc("a,b", user="me").nodes[1].ssh.user == "me"
    code, _, err = orch(["exec", "-w", "bad;host", "--", "true"], capsys)
    assert code == 2
    code, _, err = orch(["exec", "inv.yaml", "-w", "a", "--", "true"], capsys)
    assert code == 2 and "-w" in err


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_live_output_with_a_timeout_shows_what_came_and_counts_124(
    local_inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = orch(
        ["exec", str(local_inv), "--nodes", "n0", "--timeout", "3", "--", "echo before; exec sleep 60"], capsys
    )
    assert code == 124
    assert out == "n0: before\n"
    assert "n0: timed out after 3 s" in err and "(exit 124)" in err


def test_a_long_line_is_handed_on_in_marked_pieces_in_time_linear_in_its_length() -> None:
    """The splitter used to join what was pending to each new piece and split it all again: one
    50 MB line took 28 s. Now each byte is looked at once and at most LONG_LINE bytes wait: the
    CPU time for 4 x the bytes is about 4 x (a quadratic one is 16 x; the bound is generous)."""
    import time as clock

    from orchestrator.remote.exec import LONG_LINE, LONG_LINE_MARK, LineSplitter

    got: list[str] = []
    splitter = LineSplitter("n1", lambda node, stream, line: got.append(line))
    chunk = b"x" * 65536
    for _ in range((5 * LONG_LINE) // len(chunk) + 1):
        splitter.feed("out", chunk)
        assert len(splitter.pending["out"]) < LONG_LINE
    splitter.feed("out", b"yz\nnext")
    splitter.finish()
    assert [len(x) for x in got] == [LONG_LINE + len(LONG_LINE_MARK)] * 5 + [len(chunk) + 2, 4]
    assert got[0].endswith(LONG_LINE_MARK) and got[5].endswith("xyz") and got[6] == "next"

    def cpu(megabytes: int) -> float:
        best = float("inf")
        for _ in range(3):
            s = LineSplitter("n1", lambda node, stream, line: None)
            start = clock.process_time()
            for _ in range(megabytes * 16):
                s.feed("out", chunk)
            s.finish()
            best = min(best, clock.process_time() - start)
        return max(best, 1e-3)

    assert cpu(64) / cpu(16) < 10
