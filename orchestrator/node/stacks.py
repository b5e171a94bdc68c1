"""The Python stack of every rank of a run on this node (`agent.py stacks`): `py-spy dump` per rank.

A node-side module of the agent (stdlib only, any Python >= 3.8, nothing of orch), shipped with it
into every run directory. The ranks are the job's processes (by pid and start time, `procs.py`)
whose environment has torchrun's RANK (a container's ranks too: the host sees their processes);
py-spy is the one next to this python, else on PATH, else the one the controller brought into the
run directory (`SHIPPED`: py-spy is one static binary; `receive` writes it). A rank whose stack
could not be taken says what its process was doing (`proc_state`: stopped, or in uninterruptible
sleep on a disk or NFS read): the prime suspect of a hang.
"""

from __future__ import annotations

import os
import sys
from typing import Any

try:  # imported as a package (the tests), or run from the run directory beside procs.py
    from . import procs
except ImportError:
    import procs  # type: ignore[no-redef]


def rank_processes(run_dir: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's rank processes: live processes of the job whose environment has RANK (torchrun
    sets it for its workers) and whose parent's has not the same one (a DataLoader worker or any
    other child of a rank inherits it). With their RANK, LOCAL_RANK, pid and start time."""
    parents = {pid: ppid for pid, ppid, _pg, _start in procs._proc_table()}
    envs = {pid: _rank_env(pid) for pid in sorted(procs.Job(state).processes()[0])}
    out = []
    for pid, env in sorted(envs.items()):
        if "RANK" not in env:
            continue
        parent = envs.get(parents.get(pid, 0)) or _rank_env(parents.get(pid, 0))
        if parent.get("RANK") == env["RANK"]:
            continue
        out.append(
            {
                "pid": pid,
                "start": procs.proc_start_time(pid),
                "rank": _int(env.get("RANK")),
                "local_rank": _int(env.get("LOCAL_RANK")),
            }
        )
    return sorted(out, key=lambda r: (r["rank"] is None, r["rank"], r["pid"]))


def _rank_env(pid: int) -> dict[str, str]:
    """RANK and LOCAL_RANK from a process's environment ({} when unreadable)."""
    if not pid:
        return {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            items = fh.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in items:
        key, sep, value = item.partition(b"=")
        if sep and key in (b"RANK", b"LOCAL_RANK"):
            out[key.decode()] = value.decode("ascii", "replace")
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


SHIPPED = "py-spy"
"""The py-spy the controller brought, in the run directory (`receive`)."""


def find_py_spy(run_dir: str = "") -> str | None:
    """py-spy next to this Python (`pip install py-spy` in its environment puts it there), else on
    PATH, else the one the controller brought into `run_dir`."""
    import shutil

    for here in (os.path.join(os.path.dirname(sys.executable), "py-spy"), shutil.which("py-spy")):
        if here and os.path.isfile(here) and os.access(here, os.X_OK):
            return here
    shipped = os.path.join(run_dir, SHIPPED) if run_dir else ""
    return shipped if shipped and os.path.isfile(shipped) and os.access(shipped, os.X_OK) else None


def receive(run_dir: str, size: int, stream: Any) -> str:
    """The controller's py-spy (`size` bytes of `stream`) into the run directory as `SHIPPED`,
    private and executable, created new (never through a link) and renamed into place whole: its
    path. OSError or ValueError when it cannot be written whole."""
    part = os.path.join(run_dir, f".{SHIPPED}.{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(part, flags, 0o700)
    try:
        with os.fdopen(fd, "wb") as fh:
            left = size
            while left > 0:
                chunk = stream.read(min(left, 1 << 20))
                if not chunk:
                    raise ValueError(f"py-spy came short: {size - left} of {size} bytes")
                fh.write(chunk)
                left -= len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(part, os.path.join(run_dir, SHIPPED))
    except BaseException:
        try:
            os.unlink(part)
        except OSError:
            pass
        raise
    return os.path.join(run_dir, SHIPPED)


STATES = {
    "T": "stopped (SIGSTOP or a debugger)",
    "t": "stopped by a tracer",
    "D": "in uninterruptible sleep (a disk or NFS read that does not return?)",
    "Z": "a zombie (exited, not reaped)",
}
"""A process state (`/proc/PID/stat`) that explains a stack that could not be taken."""


def proc_state(pid: int) -> str | None:
    """The process's state letter (R, S, D, T, ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode("ascii", "replace")
    except (OSError, IndexError):
        return None


def ptrace_scope() -> int | None:
    """Yama's ptrace restriction (0: classic, 1: descendants only, 2: admin only, 3: none), or
    None where the kernel has no Yama."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def dump_stack(py_spy: str, proc: dict[str, Any], timeout: float) -> dict[str, Any]:
    """`py-spy dump --full-filenames --pid PID` of one rank: its output and exit code, raw. The
    process is paused while py-spy reads it (a consistent stack; a hung rank loses nothing)."""
    import subprocess

    out = dict(proc)
    if not procs.alive(proc["pid"], proc["start"]):
        return dict(out, code=None, dump="", error="the process exited before its stack was taken")
    try:
        res = subprocess.run(
            [py_spy, "dump", "--full-filenames", "--pid", str(proc["pid"])],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return dict(out, code=None, dump="", error=f"py-spy did not answer within {timeout:g} s")
    except OSError as exc:
        return dict(out, code=None, dump="", error=f"cannot run {py_spy}: {exc.strerror or exc}")
    text = res.stdout.decode("utf-8", "replace")
    err = res.stderr.decode("utf-8", "replace").strip()
    if res.returncode == 0:
        return dict(out, code=0, dump=text, error=None)
    return dict(out, code=res.returncode, dump=text, error=(err or text.strip())[:2000])


def with_state(answer: dict[str, Any], before: str | None = None) -> dict[str, Any]:
    """A rank's answer with its process's state (`state`), said first in its error where that
    explains it (`STATES`). `before`: the state read before the dump, which wins when it explains
    the failure (py-spy's attach and detach may set a stopped process running again)."""
    after = proc_state(answer["pid"])
    state = before if before in STATES else after
    answer = dict(answer, state=state)
    if answer.get("error") and state in STATES:
        answer["error"] = f"its process is {STATES[state]} (state {state}): {answer['error']}"
    return answer


LEFT_ALONE = ("T", "t")
"""States whose process is not dumped: a stopped process would run on once py-spy detaches from
it (a user's SIGSTOP undone by looking), and a traced one refuses a second tracer anyway."""


def dump_rank(py_spy: str, proc: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One rank's answer: its stack (`dump_stack`) with its state, or only its state where it is
    stopped (`LEFT_ALONE`)."""
    before = proc_state(proc["pid"])
    if before in LEFT_ALONE:
        unread = dict(proc, code=None, dump="", error="no stack taken (attaching would set it running)")
        return with_state(unread, before)
    return with_state(dump_stack(py_spy, proc, timeout), before)


def stacks(run_dir: str, state: dict[str, Any], timeout: float, shipped: str | None = None) -> dict[str, Any]:
    """Every rank's `py-spy dump`, in parallel: one JSON object with the ranks in rank order, the
    py-spy used (null: none here), this machine's architecture, this login's uid and the ptrace
    restriction, so the controller can say why a dump was refused or bring a py-spy (`state`: the
    run directory's state.json; `shipped`: why the py-spy the controller sent could not be kept)."""
    import threading

    info: dict[str, Any] = {
        "state": state.get("state"),
        "py_spy": find_py_spy(run_dir),
        "python": sys.executable,
        "machine": os.uname().machine,
        "euid": os.geteuid(),
        "ptrace_scope": ptrace_scope(),
        "ranks": [],
    }
    if shipped:
        info["ship_error"] = shipped
    if not state:
        return dict(info, error="nothing was started here")
    ranks = rank_processes(run_dir, state)
    if not ranks or info["py_spy"] is None:
        info["ranks"] = [dict(p, code=None, dump="", error=None) for p in ranks]
        return info
    results: list[dict[str, Any]] = [{} for _ in ranks]

    def one(i: int) -> None:
        results[i] = dump_rank(info["py_spy"], ranks[i], timeout)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    info["ranks"] = [r or dict(p, code=None, dump="", error="no answer") for r, p in zip(results, ranks)]
    return info
