"""`node/tether.py`, the watcher `orch exec` starts beside its command on a node: the command
runs in the login shell as without it (exit code, output, death by a signal); when the shell's
parent (sshd's session process, on a node) goes away, nothing of the command's process group is
left, background children and a command that ignores SIGTERM included; when the command ends,
the watcher ends too and stops nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.remote.exec import command_line, timed_line


def marked(marker: str) -> list[int]:
    """Pids of live processes of this machine whose environment holds `marker`."""
    want = marker.encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if want in Path(f"/proc/{name}/environ").read_bytes():
                    out.append(int(name))
            except OSError:
                continue
    return out


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone
        return b""


def wait_for(pred: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)
    return value


def login_shell(line: str, marker: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`line` as sshd runs it: `$SHELL -c LINE` in a session of its own."""
    return subprocess.run(
        ["/bin/sh", "-c", line],
        capture_output=True,
        text=True,
        start_new_session=True,
        env={**os.environ, "SHELL": "/bin/sh", "TETHER_MARK": marker},
        **kw,
    )


def test_the_command_runs_in_the_login_shell_as_without_the_tether() -> None:
    marker = f"tether-plain-{time.monotonic_ns()}"
    p = login_shell(command_line(["echo out; echo err >&2; echo $$ > /dev/null; exit 3"], True, sys.executable), marker)
    assert (p.returncode, p.stdout, p.stderr) == (3, "out\n", "err\n")
    killed = login_shell(command_line(["kill -9 $$"], True, sys.executable), marker)
    assert killed.returncode == -signal.SIGKILL  # dies of its signal, as ssh reports it
    argv = login_shell(command_line(["echo", "a b", "$HOME"], False, sys.executable), marker)
    assert (argv.returncode, argv.stdout) == (0, "a b $HOME\n")
    timed = login_shell(timed_line(["exit 5"], True, 30, sys.executable), marker)
    assert timed.returncode == 5
    plain = login_shell(command_line(["echo", "x"], False, "/no/such/python"), marker)  # no such python: untethered
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "x\n", "")
    # the watcher saw its shell end and ended too, stopping nothing
    wait_for(lambda: marked(marker) == [], "the watchers to end with their commands")


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
@pytest.mark.parametrize("ignores_term", [False, True])
def test_when_the_sessions_process_goes_nothing_of_the_command_is_left(tmp_path: Path, ignores_term: bool) -> None:
    """`parent` stands for sshd's session process, which exits when the controller closes the
    connection: the shell it started is reparented, and the watcher stops the shell's group
    (SIGKILL 5 s after SIGTERM for a command that ignores SIGTERM)."""
    marker = f"tether-orphan-{time.monotonic_ns()}"
    ready = tmp_path / "ready"
    trap = "trap '' TERM; " if ignores_term else ""
    line = command_line([f"{trap}sleep 300 & touch {ready}; while :; do sleep 0.1; done"], True, sys.executable)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time; "
            "subprocess.Popen(['/bin/sh', '-c', sys.argv[1]], start_new_session=True); "
            "time.sleep(600)",
            line,
        ],
        env={**os.environ, "SHELL": "/bin/sh", "TETHER_MARK": marker},
    )
    try:
        wait_for(ready.exists, "the command to start")
        assert len(marked(marker)) >= 4  # the parent, the shell, its background sleep, the watcher
        parent.kill()
        parent.wait(timeout=10)
        t0 = time.monotonic()
        wait_for(lambda: marked(marker) == [], "the watcher to stop the command's group", timeout=30)
        if ignores_term:
            assert time.monotonic() - t0 >= 3  # it took the SIGKILL, KILL_AFTER_S after the SIGTERM
    finally:
        parent.kill()
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_a_connection_that_stays_leaves_a_long_command_alone(tmp_path: Path) -> None:
    """While the session's process lives, the watcher only watches: the command runs to its end."""
    marker = f"tether-stays-{time.monotonic_ns()}"
    p = login_shell(command_line(["sleep 1.5; echo done"], True, sys.executable), marker, timeout=30)
    assert (p.returncode, p.stdout) == (0, "done\n")


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash", "/usr/bin/fish", "/usr/bin/tcsh"])
def test_any_login_shell_parses_the_line_and_the_tether_works_there(shell: str, tmp_path: Path) -> None:
    """sshd runs the line with the user's login shell, whatever it is: the watcher's start is one
    `/bin/sh -c` word every shell parses alike, and the command after it stays that shell's line;
    with --timeout too (tcsh refused its `>/dev/null 2>&1` guard when it was written inline)."""
    marker = f"tether-shell-{time.monotonic_ns()}"
    env = {**os.environ, "SHELL": shell, "TETHER_MARK": marker}
    line = subprocess.run(
        [shell, "-c", command_line(["echo hi; exit 3"], True, sys.executable)],
        capture_output=True,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert (line.returncode, line.stdout, line.stderr) == (3, "hi\n", "")
    argv = subprocess.run(
        [shell, "-c", command_line(["echo", "a b", "$HOME"], False, sys.executable)],
        capture_output=True,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert (argv.returncode, argv.stdout, argv.stderr) == (0, "a b $HOME\n", "")
    for command, shell_line, out in (
        (["echo hi; exit 3"], True, "hi\n"),
        (["echo", "a b", "$HOME"], False, "a b $HOME\n"),
    ):
        timed = subprocess.run(  # orch exec --timeout: its values are /bin/sh's positional parameters
            [shell, "-c", timed_line(command, shell_line, 30, sys.executable)],
            capture_output=True,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert (timed.returncode, timed.stdout, timed.stderr) == (3 if shell_line else 0, out, "")
    ready = tmp_path / "ready"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen(sys.argv[1:], start_new_session=True); time.sleep(600)",
            shell,
            "-c",
            command_line([f"touch {ready}; sleep 300"], True, sys.executable),
        ],
        env=env,
    )
    try:
        wait_for(ready.exists, "the command to start")
        wait_for(lambda: any(b"\0-I\0-S\0-c\0" in cmdline(p) for p in marked(marker)), "the watcher to start")
        parent.kill()
        parent.wait(timeout=10)
        wait_for(lambda: marked(marker) == [], f"the watcher to stop the command under {shell}", timeout=30)
    finally:
        parent.kill()
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)
