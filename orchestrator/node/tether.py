"""Ties `orch exec`'s command on a node to the SSH session that started it.

    /bin/sh -c '... PYTHON -I -S -c "<this file>" "$PPID" </dev/null >/dev/null 2>&1 & '; COMMAND

The node's login shell (sshd runs `$SHELL -c LINE`, as a session leader) starts this watcher in
the background through sh (whose `$PPID` is the login shell), then runs the command as it would
without it: same shell, same `.bashrc`, same exit status. The watcher reads the shell's parent
(sshd's session process) once, then looks at the shell (which may have become the command by
`exec`) every `POLL_S`: when the shell is gone, the command ended and the watcher exits. When the
shell's parent changes instead (sshd's session process exited: the controller closed the
connection, Ctrl-C on `orch exec`, or the controller died), the watcher sends SIGTERM to the
shell's process group, which holds the command and what it started (background children
included), and SIGKILL `KILL_AFTER_S` later to what is left of it, itself last. Without it, a
command without a terminal outlives its SSH connection, as with every `ssh host cmd` and pdsh.
A connection closed in the few milliseconds before the watcher has read the shell's parent is
not seen (the command then outlives it, as without the watcher).

It ignores SIGTERM, SIGINT and SIGHUP (timeout(1) signals the whole group), and its stdio are
/dev/null, so it never holds the session's output open. Stdlib only, Python >= 3.8, Linux /proc.
"""

from __future__ import annotations

import os
import signal
import sys
import time

KILL_AFTER_S = 5.0
POLL_S = 0.5


def stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, process group, start time) of `pid`; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        if fields[0] == b"Z":
            return None
        return int(fields[1]), int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def members(group: int) -> list[int]:
    """Pids of the process group `group`, this process excepted."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            st = stat(int(name))
            if st is not None and st[1] == group:
                out.append(int(name))
    return out


def main(argv: list[str]) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        shell = int(argv[0])  # the login shell (sh's $PPID)
    except (IndexError, ValueError):
        return 2
    first = stat(shell)
    group = os.getpgrp()
    if first is None or first[1] != group:  # ended already, or not our shell's group: nothing to stop
        return 0
    session, _group, start = first
    parent = session if session != 1 else -1  # already orphaned: its session was gone before we looked
    while parent == session:
        time.sleep(POLL_S)
        now = stat(shell)
        if now is None or now[2] != start:
            return 0  # the command ended
        parent = now[0]
    # sshd's session process is gone and the command is not.
    # The group id cannot be reused while this process, one of its members, is alive.
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER_S
    while members(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)  # what is left, this process with it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
