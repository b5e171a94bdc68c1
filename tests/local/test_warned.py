"""`node/warned.py`, first in a container's command under `transport: slurm`: the job it runs (here a
stand-in for torchrun, which puts each rank in a session of its own) ignores the warning signal
and lives through it, every process below it gets it (the rank's handler runs), a stop's SIGTERM
goes on to the job, and it ends as the job ended (its code, or the same signal)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from orchestrator.node import unpacking

RANK = """
import signal, sys, time
got = []
signal.signal(signal.SIGUSR2, lambda s, f: got.append(s))
print("rank up", flush=True)
while not got:
    time.sleep(0.02)
print("rank got SIGUSR2", flush=True)
"""
LAUNCHER = f"""
import signal, subprocess, sys
ignored = signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
print("launcher up, SIGUSR2", "ignored" if ignored else "not ignored", flush=True)
rank = subprocess.Popen([sys.executable, "-c", {RANK!r}], start_new_session=True)
code = rank.wait()
print("launcher: rank exited", code, flush=True)
sys.exit(int(sys.argv[1]))
"""
"""torchrun's shape: the rank in a session of its own (not in the launcher's process group)."""


def warned(*inner: str, blocked: bool = False) -> subprocess.Popen[str]:
    """`warned.py` running `inner`; `blocked`: started with the warning blocked, as the agent starts
    a container runtime's client under Slurm (and the container inherits it)."""
    return subprocess.Popen(
        [sys.executable, "-c", unpacking("warned"), *inner],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})) if blocked else None,
    )


def lines_until(proc: subprocess.Popen[str], want: str, out: list[str], timeout: float = 20) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while not any(want in line for line in out):
        assert time.monotonic() < deadline, f"no {want!r} within {timeout:g} s: {out}"
        line = proc.stdout.readline()
        assert line, f"the output ended before {want!r}: {out}"
        out.append(line)


@pytest.mark.parametrize("blocked", [False, True], ids=["", "started-blocked"])
def test_the_warning_reaches_every_process_below_and_the_job_lives_through_it(blocked: bool) -> None:
    proc = warned("-c", LAUNCHER, "7", blocked=blocked)
    out: list[str] = []
    lines_until(proc, "rank up", out)
    assert "launcher up, SIGUSR2 ignored\n" in out
    proc.send_signal(signal.SIGUSR2)  # what the container's init forwards from the runtime's client
    rest, _ = proc.communicate(timeout=30)
    assert rest.splitlines() == ["rank got SIGUSR2", "launcher: rank exited 0"], out + [rest]
    assert proc.returncode == 7  # the job's own exit code


def test_a_stop_goes_on_to_the_job_and_it_ends_by_the_same_signal() -> None:
    proc = warned("-c", "import time; print('up', flush=True); time.sleep(300)")
    out: list[str] = []
    lines_until(proc, "up", out)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_the_job_runs_with_the_wrappers_interpreter_and_arguments() -> None:
    proc = warned("-c", "import sys; print(sys.executable, sys.argv[1:])", "a b", "--x=1")
    out, _ = proc.communicate(timeout=30)
    assert out == f"{sys.executable} ['a b', '--x=1']\n" and proc.returncode == 0
