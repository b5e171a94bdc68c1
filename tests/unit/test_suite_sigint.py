"""The suite's processes take SIGINT as they would from a terminal, however the suite was started.

A suite started in the background (`make test &`, `nohup make test`, a CI runner's background
step) inherits SIGINT ignored, and an ignored signal survives exec: every orch the Ctrl-C tests
start would ignore their SIGINT, and those tests would fail on the machine, not on the code."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD_SEES = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"


def test_the_suite_process_takes_sigint() -> None:
    """conftest restores it in the controller and in every xdist worker, before any test starts."""
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


def test_a_process_the_suite_starts_takes_sigint() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD_SEES], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out


def test_restoring_works_in_a_process_started_with_sigint_ignored() -> None:
    """What conftest does, in a process that starts as a background job's would."""
    code = (
        "import subprocess, sys\n"
        "from tests.procs_support import take_sigint\n"
        "take_sigint()\n"
        f"print(subprocess.run([sys.executable, '-c', {CHILD_SEES!r}], capture_output=True, text=True).stdout)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert out.stdout.strip() == "False", out
