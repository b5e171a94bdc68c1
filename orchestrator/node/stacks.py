"""The Python stack of every rank of a run on this node (`agent.py stacks`): `py-spy dump` per rank.

A node-side module of the agent (stdlib only, any Python >= 3.8, nothing of orch), shipped with it
into every run directory. The ranks are the job's processes (by pid and start time, `procs.py`)
whose environment has torchrun's RANK; py-spy is the one next to the job's python, else on PATH.
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


def find_py_spy() -> str | None:
    """py-spy next to this Python (the job's: `pip install py-spy` in its environment puts it
    there), else on PATH."""
    import shutil

    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


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
    return dict(
        out, code=res.returncode, dump=text, error=None if res.returncode == 0 else (err or text.strip())[:2000]
    )


def stacks(run_dir: str, state: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Every rank's `py-spy dump`, in parallel: one JSON object with the ranks in rank order, the
    py-spy used (null: none here), this login's uid and the ptrace restriction, so the controller
    can say why a dump was refused (`state`: the run directory's state.json)."""
    import threading

    info: dict[str, Any] = {
        "state": state.get("state"),
        "py_spy": find_py_spy(),
        "python": sys.executable,
        "euid": os.geteuid(),
        "ptrace_scope": ptrace_scope(),
        "ranks": [],
    }
    if not state:
        return dict(info, error="nothing was started here")
    ranks = rank_processes(run_dir, state)
    if not ranks or info["py_spy"] is None:
        info["ranks"] = [dict(p, code=None, dump="", error=None) for p in ranks]
        return info
    results: list[dict[str, Any]] = [{} for _ in ranks]

    def one(i: int) -> None:
        results[i] = dump_stack(info["py_spy"], ranks[i], timeout)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    info["ranks"] = [r or dict(p, code=None, dump="", error="no answer") for r, p in zip(results, ranks)]
    return info
