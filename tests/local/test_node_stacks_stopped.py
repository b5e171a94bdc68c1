"""`node/stacks.py` and a rank whose process is stopped: its state is read before any attach, it is
named as stopped, and no py-spy touches it (a detach would set it running again: looking must not
undo a user's SIGSTOP)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.node import procs
from orchestrator.node.stacks import dump_rank, proc_state


def wait_state(pid: int, want: str, deadline_s: float = 10.0) -> str | None:
    end = time.monotonic() + deadline_s
    state = proc_state(pid)
    while state != want and time.monotonic() < end:
        time.sleep(0.01)
        state = proc_state(pid)
    return state


def test_a_stopped_rank_is_named_and_left_stopped(tmp_path: Path) -> None:
    called = tmp_path / "py-spy-called"
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\ntouch {called}\necho 'Error: Failed to get stack traces' >&2\nexit 1\n")
    fake.chmod(0o755)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        start = procs.proc_start_time(rank.pid)
        assert start is not None
        os.kill(rank.pid, signal.SIGSTOP)
        assert wait_state(rank.pid, "T") == "T"
        answer = dump_rank(str(fake), {"pid": rank.pid, "start": start, "rank": 2}, timeout=5)
        assert answer["state"] == "T"
        assert answer["error"].startswith("its process is stopped (SIGSTOP or a debugger) (state T)"), answer
        assert answer["dump"] == "" and answer["code"] is None
        assert not called.exists(), "py-spy was run on a stopped process"
        assert proc_state(rank.pid) == "T"
        os.kill(rank.pid, signal.SIGCONT)
        assert wait_state(rank.pid, "S") == "S"
        answer = dump_rank(str(fake), {"pid": rank.pid, "start": start, "rank": 2}, timeout=5)
        assert called.exists(), "a running rank's stack is taken"
        assert answer["error"] == "Error: Failed to get stack traces" and answer["state"] == "S", answer
    finally:
        rank.kill()
        rank.wait()
