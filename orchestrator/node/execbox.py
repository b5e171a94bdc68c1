"""`orch exec --container`'s node side: the command in the run's container on this node, and
stopped there (not just its client here) on a timeout, a signal or a lost controller.

    PYTHON -I -S -c "<this file>" RUNTIME PS EXEC RUN TIMEOUT BOX_PYTHON GRACE FILTER... -- COMMAND...

It finds the one running container of the run's launch on this node (`RUNTIME PS -q --no-trunc`
with each `--filter FILTER`: the labels of the run, the node and the launch nonce; a full 64-hex
ID, else exit 125 saying there is none), then runs `RUNTIME EXEC -e ORCH_EXEC=<token> ID COMMAND...`. A runtime's exec
client is not the command: killing it (the tether, timeout(1), a closed session) leaves the
command running in the container. So the command's processes carry a token of this call in
their environment (inherited by what they start), and the stop is done inside the container, by
the image's python (`BOX_PYTHON`, the job's: `KILL`): SIGTERM to every process with the token,
SIGKILL `GRACE` seconds later to what is left, and it answers what it found and what is left.

This process (in the login shell's process group, which the tether and a local transport's close
kill whole) waits for a supervisor in a session of its own, which runs the client and does the
stop: on `TIMEOUT` (0: none), on SIGTERM, SIGINT or SIGHUP here (forwarded), and when this
process is gone (killed with its group: a pipe between them ends). What it says of a stop comes
after the stop's answer: exit 124 on a timeout once nothing of the command is left; 255 and why
when something is. Otherwise the command's own exit code.

Stdlib only, Python >= 3.8, nothing of orch; Linux.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import time
from typing import NamedTuple

TOKEN = "ORCH_EXEC"
"""The environment variable that marks the command's processes in the container."""
FULL_ID = re.compile(r"^[0-9a-f]{64}$")
NO_CONTAINER = 125
TIMED_OUT = 124
NOT_STOPPED = 255
STOP_ANSWER_S = 60.0
"""How long the stop inside the container may take beyond its grace (the runtime's exec)."""
KILL = r"""
import json, os, signal, sys, time
want = ("@TOKEN@=" + sys.argv[1]).encode()
grace = float(sys.argv[2])
me = os.getpid()
def ours():
    out = []
    for n in os.listdir("/proc"):
        if n.isdigit() and int(n) != me:
            try:
                with open("/proc/" + n + "/environ", "rb") as fh:
                    if want in fh.read().split(b"\0"):
                        out.append(int(n))
            except OSError:
                pass
    return out
def send(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
found = ours()
send(found, signal.SIGTERM)
left, end = found, time.time() + grace
while left and time.time() < end:
    time.sleep(0.1)
    left = ours()
killed = list(left)
send(killed, signal.SIGKILL)
end = time.time() + 5
while left and time.time() < end:
    time.sleep(0.1)
    left = ours()
print(json.dumps({"found": len(found), "killed": len(killed), "left": left}))
""".replace("@TOKEN@", TOKEN)
"""Run by the image's python inside the container (`RUNTIME EXEC ID BOX_PYTHON -c KILL TOKEN GRACE`):
a zombie's environ reads empty, so what is left is what still runs."""


def say(text: str) -> None:
    try:
        sys.stderr.write("orch: " + text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # the session is gone: no one to tell
        pass


def find(runtime: str, ps: str, run: str, filters: list[str]) -> tuple[str | None, str]:
    """The full ID of the run's running container on this node, or (None, why not)."""
    argv = [runtime, ps, "-q", "--no-trunc"]
    for f in filters:
        argv += ["--filter", f]
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot list the containers: {exc}"
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, f"{runtime} {ps} failed: {err[-1] if err else f'exit {res.returncode}'}"
    ids = [w for w in res.stdout.decode("ascii", "replace").split() if FULL_ID.match(w)]
    if len(ids) != 1:
        return None, (
            f"no running container of run {run} on this node"
            if not ids
            else f"{len(ids)} running containers of run {run} on this node"
        )
    return ids[0], ""


class Swept(NamedTuple):
    """One sweep of the container: how many processes of the command it found, whether any needed
    SIGKILL, and why it failed (None: nothing of the command is left)."""

    found: int = 0
    killed: bool = False
    error: str | None = None


def stop_inside(runtime: str, execw: str, ident: str, python: str, token: str, grace: float) -> Swept:
    """Stop every process of the command in the container (one sweep)."""
    argv = [runtime, execw, ident, python, "-c", KILL, token, f"{grace:g}"]
    try:
        res = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=grace + STOP_ANSWER_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Swept(error=f"the stop in the container did not answer: {exc}")
    lines = res.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        return Swept(error=f"the stop in the container failed: {err[-1] if err else f'exit {res.returncode}'}")
    if answer.get("left"):
        return Swept(error=f"{answer['left']} still running in the container after SIGKILL")
    return Swept(int(answer.get("found") or 0), bool(answer.get("killed")))


SWEEPS = 3
"""How many times the stop sweeps the container while the command's client still runs after it: a
command still starting when the stop came (the runtime's exec slow under load) has processes the
first sweep could not see, and its client ends only once they are gone."""
CLIENT_END_S = 5.0
"""How long the client may take to end after a sweep that left nothing of its command."""


def stop_all(client: subprocess.Popen, box: tuple[str, ...]) -> tuple[bool, str]:
    """Sweep the container until the command's client ends with its command (at most `SWEEPS`
    times): (nothing is left, what was done)."""
    runtime, execw, ident, python, token, grace = box
    found, killed, error = 0, False, None
    for _ in range(SWEEPS):
        swept = stop_inside(runtime, execw, ident, python, token, float(grace))
        if swept.error is not None:
            error = swept.error
            break
        found, killed = found + swept.found, killed or swept.killed
        try:
            client.wait(CLIENT_END_S)
            break
        except subprocess.TimeoutExpired:
            continue  # its command runs on: it started after that sweep looked
    if client.poll() is None:
        client.kill()
        client.wait()
    if error is not None:
        return False, error
    how = "SIGTERM" + (f", SIGKILL {float(grace):g} s later" if killed else "")
    return True, f"{found} processes of the command in container {ident[:12]} were stopped ({how})"


def supervise(argv: list[str], alive_fd: int, timeout: float, stop: list[int], box: tuple[str, ...]) -> int:
    """The client, then the stop when it is due: the command's exit code, or what the stop says."""
    client = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout if timeout > 0 else None
    why = None
    while why is None:
        code = client.poll()
        if code is not None:
            return code if code >= 0 else 128 - code
        if stop:
            why = "signal"
            break
        wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
        try:
            ready = select.select([alive_fd], [], [], wait)[0]
        except InterruptedError:
            continue
        if ready and not os.read(alive_fd, 1):
            why = "gone"
        elif deadline is not None and time.monotonic() >= deadline:
            why = "timeout"
    ok, done = stop_all(client, box)
    if why == "timeout":
        if ok:
            say(f"timed out after {timeout:g} s: {done}")
            return TIMED_OUT
        say(f"timed out after {timeout:g} s, and the command could not be stopped: {done}")
        return NOT_STOPPED
    say(done if ok else "the command could not be stopped: " + done)
    return 128 + (stop[0] if stop else signal.SIGHUP) if ok else NOT_STOPPED


def main(args: list[str]) -> int:
    try:
        runtime, ps, execw, run, timeout_s, python, grace = args[:7]
        at = args.index("--")
        filters, command = args[7:at], args[at + 1 :]
        timeout = float(timeout_s)
    except ValueError:
        filters, command = [], []
    if not filters or not command:
        say("execbox: bad arguments")
        return 2
    ident, why = find(runtime, ps, run, filters)
    if ident is None:
        say(why)
        return NO_CONTAINER
    token = secrets.token_hex(8)
    argv = [runtime, execw, "-e", TOKEN + "=" + token, ident, *command]
    stop: list[int] = []
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the supervisor: a session of its own, which a kill of the login shell's group misses
        os.close(alive_w)
        os.setsid()
        code = NOT_STOPPED
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, lambda signum, _frame: stop.append(signum))
            code = supervise(argv, alive_r, timeout, stop, (runtime, execw, ident, python, token, grace))
        except Exception as exc:  # said, never a traceback on the session
            say(f"execbox: {type(exc).__name__}: {exc}")
        finally:
            os._exit(code)
    os.close(alive_r)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # passed on: the supervisor stops the command
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
