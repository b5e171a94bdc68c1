"""A stranger process that keeps every signal sent to it, for "left alone" assertions.

"It was not signalled" cannot be shown by waiting a while and seeing the process still alive: a
loaded machine may simply not have run the signal's effect yet. The stranger here blocks the
signals one can block, so any that was sent stays pending, and the kernel shows it in
/proc/PID/status (SigPnd, ShdPnd) the moment kill() returns. SIGKILL cannot be blocked: it leaves
the process dead, dying (SIGKILL pending) or a zombie, which `received` reports too. So once the
code under test has returned, `received(pid) == set()` proves no signal reached the process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

BLOCKED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM")
_CODE = (
    "import signal, time\n"
    f"signal.pthread_sigmask(signal.SIG_BLOCK, {{{', '.join('signal.' + s for s in BLOCKED)}}})\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def stranger(**popen: object) -> subprocess.Popen[str]:
    """A process in a session (and process group) of its own, signals blocked, once it is ready."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CODE], stdout=subprocess.PIPE, text=True, start_new_session=True, **popen
    )  # type: ignore[call-overload]
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n", "the stranger did not start"
    return proc  # type: ignore[no-any-return]


def received(pid: int) -> set[str]:
    """The signals sent to `pid` so far (pending, since it blocks them), "SIGKILL" when it is dying,
    "exited" when it is a zombie or gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {"exited"}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if fields["State"].strip()[:1] in ("Z", "X"):
        return {"exited"}
    mask = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return {signal.Signals(n).name for n in range(1, 65) if mask >> (n - 1) & 1 and n in _VALID}


_VALID = {s.value for s in signal.Signals}


def take_sigint() -> None:
    """Take SIGINT as a terminal's foreground job does (KeyboardInterrupt here, the default in every
    process started from here), where this process was started with it ignored: a suite run in the
    background (`make test &`, nohup) inherits SIGINT ignored, an ignored signal survives exec,
    and the Ctrl-C tests' processes would then never see theirs. A handler does not survive exec,
    so the children start with the default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def own_sleeps(first: int, second: int) -> tuple[str, str]:
    """`sleep S.PID` command lines for a test that looks for its command's processes with `running`,
    which searches the whole machine: the test process's pid makes them its own, whatever other
    tests run beside it on other workers (two cases of one test once saw, and killed, each other's
    `sleep 95.25`)."""
    return f"sleep {first}.{os.getpid()}", f"sleep {second}.{os.getpid()}"


def running(words: str) -> list[int]:
    """This machine's processes whose command line is exactly `words` (a container's included:
    they are this machine's processes too)."""
    want = words.replace(" ", "\0").encode() + b"\0"
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == want:
                    out.append(int(pid))
            except OSError:
                pass
    return out
