"""Process identity on a node: which processes are a run's, known by pid AND start time.

A node-side module of the agent (stdlib only, any Python >= 3.8, nothing of orch), shipped with it
into every run directory and imported by the agent (`agent.py`), the log reader (liveness) and
the stacks dump. Nothing is signalled on the strength of a number alone: a pid is the job's only
while the process under it has the start time recorded with it (field 22 of /proc/PID/stat, on
this boot: state.json's `boot_id`), and a process group only while its leader does, or, the
leader gone, for the members that carry the run's ORCH_RUN_ID, ORCH_NODE and ORCH_LAUNCH. A process that took
a recorded pid or process group since (pid reuse) is left alone and reported as a stranger.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Mapping


def boot_id() -> str | None:
    """This boot's id: a start time (ticks since boot) names a process on this boot only."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def this_boot(state: dict[str, Any]) -> bool:
    """Were the pids state.json records taken on this boot (or does it not say)?"""
    recorded = state.get("boot_id")
    return not recorded or recorded == boot_id()


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 first); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def proc_start_time(pid: int, zombie: bool = False) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks); None when the process is gone (or,
    unless `zombie`, has exited and waits to be reaped).

    A pid plus its start time names one process for good, so a recycled pid is never killed."""
    fields = _stat_fields(pid)
    if not fields or (fields[0] == "Z" and not zombie):
        return None
    return int(fields[19]) if len(fields) > 19 else None


def alive(pid: int | None, start: int | None = None) -> bool:
    """Is this exact process (pid, and start time when known) still running?"""
    if not pid:
        return False
    st = proc_start_time(pid)
    return st is not None and (start is None or st == start)


def _proc_table() -> list[tuple]:
    """(pid, ppid, pgid, start time) of every live process visible in /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields and len(fields) > 19 and fields[0] != "Z":
            out.append((int(name), int(fields[1]), int(fields[2]), int(fields[19])))
    return out


def descendants(root: int) -> list[tuple[int, int]]:
    """Every live process below `root` in the process tree (children first, then theirs), with
    its start time."""
    children: dict[int, list[tuple[int, int]]] = {}
    for pid, ppid, _pg, start in _proc_table():
        children.setdefault(ppid, []).append((pid, start))
    out, todo = [], list(children.get(root, []))
    while todo:
        proc = todo.pop(0)
        out.append(proc)
        todo.extend(children.get(proc[0], []))
    return out


IDENTITY = ("ORCH_RUN_ID", "ORCH_NODE", "ORCH_LAUNCH")
"""The environment variables that make a process the job's (`tagged`): the run's id, the node and
the launch nonce. What the agent runs that is not the job (the stop hook) is started without them,
or a stop would take it for the job and kill it."""


def without_identity(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less the job's identity (`IDENTITY`): for a process the agent starts beside the job."""
    return {k: v for k, v in env.items() if k not in IDENTITY}


def tagged(pid: int, run: str, node: str, nonce: str | None = None) -> bool:
    """Does the process's environment carry this run's identity (ORCH_RUN_ID and ORCH_NODE
    exactly, and with `nonce` ORCH_LAUNCH: a run of the same id started by another controller is
    not this one)?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = set(fh.read().split(b"\0"))
    except OSError:  # gone, or another user's
        return False
    run_id, node_name, launch = IDENTITY
    want = {(run_id + "=" + run).encode(), (node_name + "=" + node).encode()}
    if nonce:
        want.add((launch + "=" + nonce).encode())
    return want <= env


def marked(run: str, node: str, nonce: str | None = None) -> dict[int, int]:
    """Processes whose environment carries this run's identity, with their start times.

    The last sweep of `stop`: catches a worker started after the agent's last snapshot when the agent
    itself was killed. It matches the run's unique id and launch nonce, never a command-line pattern."""
    me = os.getpid()
    return {pid: start for pid, _pp, _pg, start in _proc_table() if pid != me and tagged(pid, run, node, nonce)}


def send(pid: int | None, start: int | None, sig: int) -> bool:
    """Signal `pid` only while it is the process that started at `start`; whether it was sent.

    Through a pidfd where there is one (Python >= 3.9, Linux >= 5.3): the start time is checked on
    the process the pidfd holds, so not even a reuse between the check and the signal can hit a
    stranger. Elsewhere the check comes right before kill()."""
    if not pid or start is None:
        return False
    fd = None
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:  # ENOSYS (older kernel), EPERM in some sandboxes: check, then kill
            fd = None
    try:
        if proc_start_time(pid) != start:
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


class Job:
    """The processes state.json records as the job's, each known by pid and start time, and the
    strangers found under the recorded ids (to be left alone)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.run, self.node = str(state.get("run") or ""), str(state.get("node") or "")
        self.nonce = str(state.get("nonce") or "") or None

    def group(self) -> tuple[dict[int, int], dict[int, int], bool]:
        """(the group's members that are the job's, the members that are not, whether the group is
        still the job's as a whole: its leader is the process recorded with it)."""
        pgid = self.state.get("pgid")
        if not pgid or not this_boot(self.state):
            return {}, {}, False
        members = {pid: start for pid, _pp, pg, start in _proc_table() if pg == pgid}
        leader_start = self.state.get("pgid_start")
        if leader_start is not None and members.get(pgid) == leader_start:
            return members, {}, True  # the leader holds the id: every member is of its session
        ours = {p: s for p, s in members.items() if self.run and tagged(p, self.run, self.node, self.nonce)}
        return ours, {p: s for p, s in members.items() if p not in ours}, False

    def processes(self) -> tuple[dict[int, int], dict[int, int]]:
        """(every live process of the job: pid -> start time; the strangers under its ids)."""
        ours, strangers, _whole = self.group()
        if this_boot(self.state):
            for pid, start in self.state.get("procs") or []:
                if alive(pid, start):
                    ours[pid] = start
            pid, start = self.state.get("pid"), self.state.get("pid_start")
            if pid and alive(pid, start) and start is not None:
                ours[pid] = start
            elif pid and proc_start_time(pid) is not None and pid not in ours:
                strangers.setdefault(pid, proc_start_time(pid) or 0)
        if self.run and self.node:
            ours.update(marked(self.run, self.node, self.nonce))
        ours.pop(os.getpid(), None)
        for pid in ours:
            strangers.pop(pid, None)
        return ours, strangers

    def signal(self, sig: int) -> list[int]:
        """Send `sig` once to every process of the job (the group at once while it is still the
        job's, each other process by pid and start time); the pids it went to."""
        ours, _strangers = self.processes()
        members, _others, whole = self.group()
        sent = []
        if whole:
            try:
                os.killpg(int(self.state["pgid"]), sig)
                sent = [p for p in members if p in ours]
            except (ProcessLookupError, PermissionError):
                pass
        return sorted(sent + [pid for pid, start in ours.items() if pid not in sent and send(pid, start, sig)])


def group_alive(state: dict[str, Any]) -> bool:
    """Does a process of the job's process group remain (one that is the job's)?"""
    return bool(Job(state).group()[0])


def exit_code_of(status: int) -> int:
    """waitpid status → Popen-style code: the exit status, or -N for death by signal N."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"SIG{-code}"


def agent_alive(state: dict[str, Any]) -> bool:
    """Is the agent that state.json names (pid and start time, on this boot) still running?"""
    start = state.get("agent_start")
    return start is not None and this_boot(state) and alive(state.get("agent_pid"), start)


def job_alive(state: dict[str, Any]) -> bool:
    """Does any process of the job state.json records remain (its process group, or one of the
    processes of the agent's last snapshot, which outlive the group: torchrun's workers), each
    known by its start time?"""
    if group_alive(state):
        return True
    return this_boot(state) and any(alive(p, s) for p, s in state.get("procs") or [] if s is not None)
