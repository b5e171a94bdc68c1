#!/usr/bin/env python3
"""orch node agent: runs one node's share of a run, detached from the SSH session that started it.

Shipped with every run (copied into the node's run directory by `boot.py`), so it must stay
stdlib-only and runnable by any Python >= 3.8 the node has. The log reader (`reader.py`) runs this
module's liveness functions too, so its top-level imports stay cheap: the modules only the daemon
or the command line needs are imported where they are used. One run directory per node and run
holds:

  launch.json   what to run (argv, env, cwd, stop grace), written privately by the controller
  agent.py      this file
  node.log      `<UTC ISO time with µs>Z <out|err|orch> <text>` for every line torchrun or the agent writes
  state.json    run, node, agent_pid, pid, pgid, host, started_at, finished_at, exit_code, signal,
                state (starting|running|succeeded|failed|stopped), rewritten atomically; with every
                pid its start time (agent_start, pid_start, pgid_start, procs) and the boot_id
  torchrun/     torchrun's --log-dir

Subcommands (each prints one JSON object on stdout):

  start DIR          daemonize (double fork + setsid, stdio on /dev/null) and start torchrun in its
                     own process group; return once state.json says running, non-zero if it cannot
  status DIR [--tail N]   state.json plus liveness (is the agent / the job alive), log size and time
  stop DIR [--grace S]    SIGTERM the job's process group, SIGKILL after S seconds, wait until every
                     process of the job is gone. Idempotent.
  stacks DIR [--timeout S]  the Python stack of every rank of the job (`py-spy dump`), raw, per rank

torchrun puts every worker in a session of its own, so killing torchrun's group alone would
orphan the workers (a `kill -9` of torchrun leaves them running). The agent therefore makes itself
a child subreaper: orphaned descendants are re-parented to it, it records them (pid + start time)
in state.json, and it kills whatever is left of the tree when torchrun exits.

Nothing is signalled on the strength of a number alone: a pid is the job's only while the process
under it has the start time recorded with it (field 22 of /proc/PID/stat, on this boot), and a
process group only while its leader does, or, the leader gone, for the members that carry the
run's ORCH_RUN_ID and ORCH_NODE. A process that took a recorded pid or process group since (pid
reuse) is left alone and reported (`strangers`).

The run directory must be this user's and writable by no one else (`check_run_dir`): state.json
says what to signal, so a directory others can write to would let them choose. Files in it are
created with O_NOFOLLOW (and O_EXCL where they are new), so a planted link redirects nothing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import datetime, timezone
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

LAUNCH = "launch.json"
STATE = "state.json"
LOG = "node.log"
STOP_REQUEST = "stop.request"
# A run's states as state.json records them (orchestrator.contract.RunState on the controller)
STARTING, RUNNING, SUCCEEDED, FAILED, STOPPED = "starting", "running", "succeeded", "failed", "stopped"
STATES = (STARTING, RUNNING, SUCCEEDED, FAILED, STOPPED)
FINAL_STATES = (SUCCEEDED, FAILED, STOPPED)
STATUS_KEYS = ("state", "exit_code", "signal", "reason", "started_at", "finished_at", "pid", "pgid", "agent_pid",
               "cleanup_left")
"""The fields of state.json a status reports as they are (the log reader's `S` frames: these)."""
PR_SET_CHILD_SUBREAPER = 36


# ----------------------------------------------------------------------------- small helpers


def utc_now() -> str:
    """Node-side UTC time with microseconds: `2026-11-30T09:32:05.123456Z`."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_json(path: str) -> dict[str, Any]:
    """The JSON object in `path`, or {} when the file is missing or half-written."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def create_private(path: str) -> int:
    """A new file, private, opened for writing: never an existing file, never through a link."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)


def write_json(path: str, data: dict[str, Any]) -> None:
    """Atomic, private rewrite: readers never see a torn state.json."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.unlink(tmp)  # a leftover of a crash of this pid's namesake (never followed: unlink)
    except FileNotFoundError:
        pass
    with os.fdopen(create_private(tmp), "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)


class UntrustedDir(Exception):
    """The run directory is not this user's alone: nothing it says is acted on."""


def check_run_dir(path: str) -> None:
    """Refuse a run directory that only this user may trust: it must be a directory (not a
    link), this user's, writable by no one else, and so must every directory above it be (this
    user's or root's, and not writable by others unless sticky, like /tmp), as OpenSSH's
    StrictModes asks of ~/.ssh. state.json names what `stop` signals and launch.json what `start`
    runs: whoever can write or rename the directory could choose both. Raises UntrustedDir."""
    import stat

    path = os.path.abspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # nothing there: nothing to trust (start creates it, status and stop find nothing)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UntrustedDir(f"{path} is not a directory (a link or a file): refusing to use it")
    me = os.geteuid()
    if st.st_uid != me:
        raise UntrustedDir(f"{path} belongs to uid {st.st_uid}, not to this user ({me}): refusing to use it")
    if st.st_mode & 0o022:
        raise UntrustedDir(f"{path} is writable by others than its owner (mode {stat.S_IMODE(st.st_mode):04o}): "
                           f"refusing to use it; chmod go-w {path}")
    parent = os.path.dirname(path)
    while parent != path:
        path, st = parent, os.stat(parent)
        if st.st_uid not in (me, 0) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            raise UntrustedDir(f"{path}, above the run directory, can be changed by others (uid {st.st_uid}, "
                               f"mode {stat.S_IMODE(st.st_mode):04o}): refusing to use it; chmod go-w {path} "
                               "or set job.run_root elsewhere")
        parent = os.path.dirname(path)


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
    return raw[raw.rfind(")") + 2:].split()


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


def tagged(pid: int, run: str, node: str) -> bool:
    """Does the process's environment carry this run's identity (ORCH_RUN_ID and ORCH_NODE exactly)?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = set(fh.read().split(b"\0"))
    except OSError:  # gone, or another user's
        return False
    return {("ORCH_RUN_ID=" + run).encode(), ("ORCH_NODE=" + node).encode()} <= env


def marked(run: str, node: str) -> dict[int, int]:
    """Processes whose environment carries this run's identity, with their start times.

    The last sweep of `stop`: catches a worker started after the agent's last snapshot when the agent
    itself was killed. It matches the run's unique id, never a command-line pattern."""
    me = os.getpid()
    return {pid: start for pid, _pp, _pg, start in _proc_table() if pid != me and tagged(pid, run, node)}


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
        ours = {p: s for p, s in members.items() if self.run and tagged(p, self.run, self.node)}
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
            ours.update(marked(self.run, self.node))
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


# ----------------------------------------------------------------------------- the daemon


class NodeLog:
    """node.log: one timestamped line per output line, written by several threads."""

    def __init__(self, path: str) -> None:
        import threading

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)
        self.fh = os.fdopen(fd, "ab", buffering=0)
        self.lock = threading.Lock()

    def write(self, stream: str, text: str) -> None:
        line = ("{} {} {}\n".format(utc_now(), stream, text.rstrip("\r\n"))).encode("utf-8", "replace")
        with self.lock:
            self.fh.write(line)

    def pump(self, src: IO[bytes], stream: str) -> None:
        """Copy `src` line by line, stamping each line when it arrives."""
        for raw in iter(src.readline, b""):
            self.write(stream, raw.decode("utf-8", "replace"))
        src.close()


class Monitor:
    """The detached agent: starts torchrun, stamps its output, watches it, stops it on SIGTERM."""

    def __init__(self, run_dir: str, launch: dict[str, Any]) -> None:
        self.dir = run_dir
        self.launch = launch
        self.grace = float(launch.get("grace", 10.0))
        self.log = NodeLog(os.path.join(run_dir, LOG))
        self.state: dict[str, Any] = read_json(os.path.join(run_dir, STATE))
        self.stop_at: float | None = None
        self.stop_signal = 0
        self.term_sent: float | None = None
        self.kill_sent = False

    def save(self, **fields: Any) -> None:
        self.state.update(fields)
        write_json(os.path.join(self.dir, STATE), self.state)

    def on_signal(self, signum: int, _frame: Any) -> None:
        # only set a flag: writing the log here could deadlock on its lock
        if self.stop_at is None:
            self.stop_at = time.monotonic()
            self.stop_signal = signum

    def argv(self) -> list[str]:
        """The plan's argv, with torchrun's --log-dir pointed into this run directory."""
        argv = [str(a) for a in self.launch["argv"]]
        if self.launch.get("torchrun_log_dir") and "torch.distributed.run" in argv:
            i = argv.index("torch.distributed.run") + 1
            argv.insert(i, "--log-dir=" + os.path.join(self.dir, "torchrun"))
        return argv

    def run(self) -> int:
        import ctypes
        import socket
        import subprocess
        import threading

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            self.log.write("orch", "cannot become a child subreaper; orphaned workers may escape")
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in self.launch.get("env", {}).items()})
        argv = self.argv()
        cwd = expand(self.launch.get("cwd")) or os.path.expanduser("~")
        attempt = str(self.launch.get("env", {}).get("ORCH_ATTEMPT", "1"))
        self.log.write("orch", f"agent {os.getpid()} on {socket.gethostname()} starting"
                                f"{'' if attempt == '1' else f' attempt {attempt}'}: {' '.join(argv)} (cwd {cwd})")
        try:
            umask = self.launch.get("login_umask")
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=None if umask is None else (lambda: os.umask(umask)))
        except OSError as exc:
            reason = f"cannot start {argv[0]}: {exc.strerror or exc}"
            self.log.write("orch", reason)
            self.save(state=FAILED, exit_code=127, reason=reason, finished_at=time.time())
            return 127
        # torchrun leads a session and process group of its own: its start time names both
        st = proc_start_time(proc.pid, zombie=True)  # a job may be done already: not yet reaped
        self.save(state=RUNNING, pid=proc.pid, pgid=proc.pid, pid_start=st, pgid_start=st, started_at=time.time())
        self.log.write("orch", f"started pid {proc.pid} (process group {proc.pid})")
        pumps = [threading.Thread(target=self.log.pump, args=(s, n), daemon=True)
                 for s, n in ((proc.stdout, "out"), (proc.stderr, "err"))]
        for t in pumps:
            t.start()
        code = self.watch(proc)
        ended = time.time()  # when torchrun exited: the first-failure order, not when cleanup ended
        left = self.cleanup(proc.pid)
        for t in pumps:
            # EOF comes as soon as no writer is left; every process of the job is gone by now, so
            # a pipe still open is held by something outside the job: do not wait on it for long
            t.join(timeout=2)
        stopped = self.stop_at is not None or os.path.exists(os.path.join(self.dir, STOP_REQUEST))
        state = STOPPED if stopped else (SUCCEEDED if code == 0 else FAILED)
        sig = signal_name(code)
        self.log.write("orch", f"torchrun exited with code {code}{f' ({sig})' if sig else ''}: {state}")
        self.save(state=state, exit_code=code, signal=sig, finished_at=ended, procs=[[p, s] for p, s in left],
                  cleanup_left=[p for p, _s in left])
        return code

    def watch(self, proc: subprocess.Popen[bytes]) -> int:
        """Reap children (we are their subreaper) until torchrun exits; escalate a stop."""
        last_snapshot = 0.0
        while True:
            code = self.reap(proc.pid)
            if code is not None:
                proc.returncode = code
                return code
            now = time.monotonic()
            if self.stop_at is not None and self.term_sent is None:
                self.term_sent = now
                try:  # torchrun is our child, not reaped yet: its group cannot be anyone else's
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
                self.log.write("orch", f"agent received {signal.Signals(self.stop_signal).name}: "
                               f"sent SIGTERM to process group {proc.pid}")
            if self.term_sent is not None and not self.kill_sent and now - self.term_sent > self.grace:
                self.kill_sent = True
                self.log.write("orch", f"still running {self.grace:.0f} s after SIGTERM: SIGKILL")
                self.kill_tree(signal.SIGKILL)
            if now - last_snapshot >= 1.0:
                last_snapshot = now
                self.snapshot()
            time.sleep(0.1)

    def reap(self, main_pid: int) -> int | None:
        """Collect every exited child; return torchrun's exit code once it is among them."""
        result = None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return result
            if pid == 0:
                return result
            if pid == main_pid:
                result = exit_code_of(status)

    def snapshot(self) -> None:
        """Record the job's processes (pid, start time) so `stop` can find them without us."""
        procs = [[pid, st] for pid, st in descendants(os.getpid())]
        if procs != self.state.get("procs"):
            self.save(procs=procs)

    def kill_tree(self, sig: int) -> int:
        """Signal every process below the agent (each by pid and start time); how many got it."""
        return sum(send(pid, st, sig) for pid, st in descendants(os.getpid()))

    def cleanup(self, main_pid: int, kill_wait: float = 5.0) -> list[tuple[int, int]]:
        """Leave nothing behind: whatever torchrun left (orphaned workers) gets TERM, then KILL.
        Returns what is still there after that (pid, start time): reported, never assumed gone."""
        if not descendants(os.getpid()):
            return []
        n = self.kill_tree(signal.SIGTERM)
        self.log.write("orch", f"torchrun exited, {n} of its processes remain: SIGTERM")
        deadline = time.monotonic() + min(self.grace, 5.0)
        while descendants(os.getpid()) and time.monotonic() < deadline:
            self.reap(main_pid)
            time.sleep(0.1)
        n = self.kill_tree(signal.SIGKILL)
        if n:
            self.log.write("orch", f"SIGKILL to {n} remaining processes")
        deadline = time.monotonic() + kill_wait
        while descendants(os.getpid()) and time.monotonic() < deadline:
            self.reap(main_pid)
            time.sleep(0.05)
        self.reap(main_pid)
        left = descendants(os.getpid())
        if left:
            self.log.write("orch", f"cleanup timed out: {len(left)} processes of the job survived SIGKILL for "
                                   f"{kill_wait:.0f} s: {' '.join(str(p) for p, _s in left)}")
        return left


def expand(path: str | None) -> str | None:
    """A leading `~/` means this login's home (no shell expands it for us)."""
    if path and (path == "~" or path.startswith("~/")):
        return os.path.expanduser(path)
    return path


# ----------------------------------------------------------------------------- subcommands


def cmd_start(run_dir: str, wait: float) -> int:
    """Validate, daemonize, and report once torchrun runs (or why it could not start)."""
    launch = read_json(os.path.join(run_dir, LAUNCH))
    if not launch.get("argv"):
        return emit({"state": FAILED, "reason": f"{run_dir}/{LAUNCH} is missing or has no argv"}, 2)
    state_path = os.path.join(run_dir, STATE)
    old = read_json(state_path)
    if old and (old.get("state") not in FINAL_STATES and agent_alive(old)):
        return emit(dict(old, reason="already started here (agent {})".format(old.get("agent_pid"))), 3)
    cwd = expand(launch.get("cwd"))
    if cwd and not os.path.isdir(cwd):
        return emit({"state": FAILED, "reason": f"workdir {cwd} does not exist on this node"}, 2)
    import socket

    clear_stop_request(run_dir)
    write_json(state_path, {"run": launch.get("run"), "node": launch.get("node"), "agent_pid": None,
                            "pid": None, "pgid": None, "host": socket.gethostname(), "boot_id": boot_id(),
                            "started_at": None, "finished_at": None, "exit_code": None, "signal": None,
                            "state": STARTING})
    if os.fork() == 0:
        daemon(run_dir, launch)
    return wait_started(state_path, wait)


def clear_stop_request(run_dir: str) -> None:
    """A job started again in its run directory (`orch up` retrying the same run) must not end as
    `stopped` because the last attempt's teardown asked for a stop."""
    try:
        os.unlink(os.path.join(run_dir, STOP_REQUEST))
    except FileNotFoundError:
        pass


def daemon(run_dir: str, launch: dict[str, Any]) -> None:
    """Second half of the double fork: a session of our own, no tty, stdio on /dev/null."""
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    # the run directory's files are private; the job itself keeps the login's umask
    launch = dict(launch, login_umask=os.umask(0o077))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, 65536)
    code = 1
    try:
        monitor = Monitor(run_dir, launch)
        monitor.save(agent_pid=os.getpid(), agent_start=proc_start_time(os.getpid()))
        code = monitor.run()
    except BaseException as exc:  # the agent's own crash must still end up in state.json and node.log
        import traceback

        trace = traceback.format_exc()
        try:  # state.json first: node.log may be what failed (a planted link, a full disk)
            state = read_json(os.path.join(run_dir, STATE))
            state.update(state=FAILED, finished_at=time.time(), reason=f"agent crashed: {type(exc).__name__}: {exc}")
            write_json(os.path.join(run_dir, STATE), state)
        except BaseException:
            pass
        try:
            NodeLog(os.path.join(run_dir, LOG)).write("orch", "agent crashed: " + trace)
        except BaseException:
            pass
    os._exit(0 if code == 0 else 1)


def wait_started(state_path: str, wait: float) -> int:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        state = read_json(state_path)
        # started = torchrun was spawned; if it already ended, supervision reports how, with its log
        if state.get("state") == RUNNING or state.get("state") in FINAL_STATES and state.get("pid"):
            return emit(state, 0)
        if state.get("state") in FINAL_STATES:
            return emit(state, 1)
        time.sleep(0.05)
    return emit(dict(read_json(state_path), reason=f"the agent did not report running within {wait:.0f} s"), 1)


def status(run_dir: str, tail: int = 0) -> dict[str, Any]:
    """state.json plus what only the node can tell: liveness, log size and time, the log's tail."""
    state = read_json(os.path.join(run_dir, STATE))
    log = os.path.join(run_dir, LOG)
    out = dict(state)
    out["exists"] = bool(state)
    out["agent_alive"] = agent_alive(state)
    out["job_alive"] = job_alive(state)
    out["now"] = time.time()
    try:
        st = os.stat(log)
        out["log_size"], out["log_mtime"] = st.st_size, st.st_mtime
    except OSError:
        out["log_size"], out["log_mtime"] = 0, None
    if tail:
        out["tail"] = tail_lines(log, tail)
    return out


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


def tail_lines(path: str, n: int) -> list[str]:
    """The last n lines of a file, reading at most a few hundred KB from its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read()
    except OSError:
        return []
    return [line.decode("utf-8", "replace") for line in data.splitlines()[-n:]]


def cmd_stop(run_dir: str, grace: float) -> int:
    """SIGTERM the job, SIGKILL it after `grace`, wait until nothing of it is left. Idempotent.

    What it reports is what it saw afterwards, not what it sent: `stopped` (processes of the job
    found at the start and gone now), `remaining` (still there: the job's, or the agent), and
    `strangers` (processes under the recorded ids that are not the job's: never signalled)."""
    state_path = os.path.join(run_dir, STATE)
    state = read_json(state_path)
    if not state:
        return emit({"state": None, "stopped": [], "remaining": [], "strangers": [],
                     "note": "nothing was started here"}, 0)
    if state.get("state") not in FINAL_STATES:
        fd = os.open(os.path.join(run_dir, STOP_REQUEST), os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(utc_now() + "\n")
    agent = (state.get("agent_pid"), state.get("agent_start")) if agent_alive(state) else (None, None)
    job = Job(state)
    found, strangers = job.processes()
    if agent[0]:
        # One SIGTERM, through the agent (which forwards it and records the exit code): torchrun
        # turns each SIGTERM into an exception, and a second one in the middle of its shutdown
        # leaves it hanging until SIGKILL.
        send(agent[0], agent[1], signal.SIGTERM)
    else:
        job.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while job.processes()[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = job.signal(signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while (job.processes()[0] or alive(*agent)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left, more_strangers = job.processes()
    strangers.update(more_strangers)
    remaining = sorted(left) + ([agent[0]] if agent[0] and alive(*agent) else [])
    state = read_json(state_path)
    if state.get("state") not in FINAL_STATES and not agent_alive(state):
        # the agent was gone (killed): record the end ourselves so the run does not look alive
        state.update(state=STOPPED, finished_at=time.time(), procs=[])
        write_json(state_path, state)
    out = dict(state, stopped=sorted(p for p in found if p not in left), killed=sorted(killed),
               remaining=remaining, strangers=sorted(strangers))
    return emit(out, 0 if not remaining else 1)


# ----------------------------------------------------------------------------- stacks


def rank_processes(run_dir: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's rank processes: live processes of the job whose environment has RANK (torchrun
    sets it for its workers) and whose parent's has not the same one (a DataLoader worker or any
    other child of a rank inherits it). With their RANK, LOCAL_RANK, pid and start time."""
    parents = {pid: ppid for pid, ppid, _pg, _start in _proc_table()}
    envs = {pid: _rank_env(pid) for pid in sorted(Job(state).processes()[0])}
    out = []
    for pid, env in sorted(envs.items()):
        if "RANK" not in env:
            continue
        parent = envs.get(parents.get(pid, 0)) or _rank_env(parents.get(pid, 0))
        if parent.get("RANK") == env["RANK"]:
            continue
        out.append({"pid": pid, "start": proc_start_time(pid), "rank": _int(env.get("RANK")),
                    "local_rank": _int(env.get("LOCAL_RANK"))})
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
    if not alive(proc["pid"], proc["start"]):
        return dict(out, code=None, dump="", error="the process exited before its stack was taken")
    try:
        res = subprocess.run([py_spy, "dump", "--full-filenames", "--pid", str(proc["pid"])], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(out, code=None, dump="", error=f"py-spy did not answer within {timeout:g} s")
    except OSError as exc:
        return dict(out, code=None, dump="", error=f"cannot run {py_spy}: {exc.strerror or exc}")
    text = res.stdout.decode("utf-8", "replace")
    err = res.stderr.decode("utf-8", "replace").strip()
    return dict(out, code=res.returncode, dump=text, error=None if res.returncode == 0 else (err or text.strip())[:2000])


def cmd_stacks(run_dir: str, timeout: float) -> int:
    """Every rank's `py-spy dump`, in parallel: one JSON object with the ranks in rank order, the
    py-spy used (null: none here), this login's uid and the ptrace restriction, so the controller
    can say why a dump was refused."""
    import threading

    state = read_json(os.path.join(run_dir, STATE))
    info: dict[str, Any] = {"state": state.get("state"), "py_spy": find_py_spy(), "python": sys.executable,
                            "euid": os.geteuid(), "ptrace_scope": ptrace_scope(), "ranks": []}
    if not state:
        return emit(dict(info, error="nothing was started here"), 0)
    procs = rank_processes(run_dir, state)
    if not procs or info["py_spy"] is None:
        info["ranks"] = [dict(p, code=None, dump="", error=None) for p in procs]
        return emit(info, 0)
    results: list[dict[str, Any]] = [{} for _ in procs]

    def one(i: int) -> None:
        results[i] = dump_stack(info["py_spy"], procs[i], timeout)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    info["ranks"] = [r or dict(p, code=None, dump="", error="no answer") for r, p in zip(results, procs)]
    return emit(info, 0)


def emit(data: dict[str, Any], code: int) -> int:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()
    return code


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="agent.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    p = sub.add_parser("start", help="start the job detached; return once it runs")
    p.add_argument("dir")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the job to run")
    p = sub.add_parser("status", help="state.json plus liveness")
    p.add_argument("dir")
    p.add_argument("--tail", type=int, default=0, help="also return the last N lines of node.log")
    p = sub.add_parser("stop", help="stop the job (TERM, then KILL after --grace) and wait")
    p.add_argument("dir")
    p.add_argument("--grace", type=float, default=10.0)
    p = sub.add_parser("stacks", help="the Python stack of every rank (py-spy dump)")
    p.add_argument("dir")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds py-spy may take per rank")
    args = parser.parse_args(argv)
    run_dir = os.path.abspath(expand(args.dir) or ".") if getattr(args, "dir", None) else ""
    if run_dir:
        try:
            check_run_dir(run_dir)
        except UntrustedDir as exc:
            return emit({"state": None, "error": str(exc), "untrusted": True}, 2)
    if args.cmd == "start":
        return cmd_start(run_dir, args.wait)
    if args.cmd == "status":
        return emit(status(run_dir, args.tail), 0)
    if args.cmd == "stop":
        return cmd_stop(run_dir, args.grace)
    if args.cmd == "stacks":
        return cmd_stacks(run_dir, args.timeout)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
