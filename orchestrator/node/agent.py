#!/usr/bin/env python3
"""orch node agent: runs one node's share of a run, detached from the SSH session that started it.

Shipped with every run (copied into the node's run directory by `boot.py`, with `procs.py` and
`stacks.py`), so it must stay
stdlib-only and runnable by any Python >= 3.8 the node has. The log reader (`reader.py`) runs this
module's liveness functions too, so its top-level imports stay cheap: the modules only the daemon
or the command line needs are imported where they are used. One run directory per node and run
holds:

  launch.json   what to run (argv, env, cwd, stop grace, an attached run's lease_s; `warning_blocked`:
                a container's job under Slurm, started with the warning signal blocked, see `WARNING`),
                written privately by the controller
  lease         an attached run's lease: renewed by the controller (touched by its log reader);
                older than lease_s, the agent stops the job (state stopped, reason, lease_expired)
  agent.py      this file
  node.log      `<UTC ISO time with µs>Z <out|err|orch> <text>` for every line torchrun or the agent writes,
                a worker's text behind its field `[<role><local rank>]:` (`WORKER_FIELD`)
  state.json    run, node, agent_pid, pid, pgid, host, started_at, finished_at, failed_at (when
                torchrun first said a worker failed: the order of a run's failures), exit_code, signal,
                state (starting|running|succeeded|failed|stopped), rewritten atomically (in place,
                in its padding, when the disk is full: disk_full says so); with every
                pid its start time (agent_start, pid_start, pgid_start, procs) and the boot_id
  torchrun/     torchrun's --log-dir

Subcommands (each prints one JSON object on stdout):

  start DIR          daemonize (double fork + setsid, stdio on /dev/null) and start torchrun in its
                     own process group; return once state.json says running, non-zero if it cannot
                     (--foreground: the same answer, then the agent runs in this process until the job
                     ends, for a transport that holds it: a Slurm step; exit 0 only if it succeeded)
  status DIR [--tail N] [--nonce X]   state.json plus liveness (is the agent / the job alive), log
                     size and time
  stop DIR [--grace S] [--nonce X]    SIGTERM the job's process group, SIGKILL after S seconds, wait
                     until every process of the job is gone. Idempotent. Signals first and writes
                     after (stop.request), so a full disk never keeps a job from being stopped.

With --nonce (the launch nonce, launch.json `nonce`), a run directory claimed by another launch
(`launch.nonce`: another controller's run of the same id) is never stopped nor reported as ours.
  stacks DIR [--timeout S] [--py-spy-bytes N]  the Python stack of every rank of the job (`py-spy
                     dump`), raw, per rank; with N, first the controller's py-spy from stdin
  sweep --spec JSON  a launch's containers left on this node (a killed agent's): `list` (an argv
                     that prints IDs) run without a shell, every line that is a full 64-hex ID
                     removed by `remove -- ID...`, nothing else (`ignored`: what the listing also said)
  collect DIR --root R [--limit N] [--remove] [--nonce X]  the last N bytes of node.log; with
                     --remove, then the run directory goes (and the run id's above it once empty):
                     only `R/<run-id>/<node>`, trusted, this launch's, its job and agent gone

torchrun puts every worker in a session of its own, so killing torchrun's group alone would
orphan the workers (a `kill -9` of torchrun leaves them running). The agent therefore makes itself
a child subreaper: orphaned descendants are re-parented to it, it records them (pid + start time)
in state.json, and it kills whatever is left of the tree when torchrun exits.

Nothing is signalled on the strength of a number alone: which processes are the job's (pid and
start time, the boot id, the run's tag) is `procs.py`, shipped beside this file with `stacks.py`
(`agent.py stacks`); the agent imports them as siblings (a package) or by name (run from its
run directory).

The run directory must be this user's and writable by no one else (`trust.check_run_dir`): state.json
says what to signal, so a directory others can write to would let them choose. Files in it are
created with O_NOFOLLOW (and O_EXCL where they are new), so a planted link redirects nothing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
from datetime import datetime, timezone
from typing import IO, TYPE_CHECKING, Any

try:  # imported as a package (the log reader, the tests), or run from the run directory beside procs.py
    from .procs import (
        Job,
        agent_alive,
        alive,
        boot_id,
        descendants,
        exit_code_of,
        job_alive,
        marked,
        proc_start_time,
        send,
        signal_name,
        without_identity,
    )
    from .trust import UntrustedDir, check_run_dir
except ImportError:
    from procs import (  # type: ignore[no-redef]
        Job,
        agent_alive,
        alive,
        boot_id,
        descendants,
        exit_code_of,
        job_alive,
        marked,
        proc_start_time,
        send,
        signal_name,
        without_identity,
    )
    from trust import UntrustedDir, check_run_dir  # type: ignore[no-redef]

if TYPE_CHECKING:
    import subprocess
    import threading

LAUNCH = "launch.json"
OWNER = "launch.nonce"
"""The nonce of the launch that claimed this run directory (created once, never rewritten):
another controller's run of the same id is refused here, and never stopped or read."""
STATE = "state.json"
LOG = "node.log"
STOP_REQUEST = "stop.request"
LEASE = "lease"
"""An attached run's lease (launch.json `lease_s`): each renewal through the log reader touches
it; once its mtime has not changed for `lease_s` on the node's boot clock (`Monitor.check_lease`),
the agent stops the job and says why. A detached run has no lease: it runs on its own."""
# A run's states as state.json records them (orchestrator.contract.RunState on the controller)
STARTING, RUNNING, SUCCEEDED, FAILED, STOPPED = "starting", "running", "succeeded", "failed", "stopped"
STATES = (STARTING, RUNNING, SUCCEEDED, FAILED, STOPPED)
FINAL_STATES = (SUCCEEDED, FAILED, STOPPED)
STATUS_KEYS = (
    "state",
    "exit_code",
    "signal",
    "reason",
    "started_at",
    "finished_at",
    "failed_at",
    "pid",
    "pgid",
    "agent_pid",
    "cleanup_left",
    "disk_full",
)
"""The fields of state.json a status reports as they are (the log reader's `S` frames: these)."""
PR_SET_CHILD_SUBREAPER = 36
WARNING = signal.SIGUSR2
"""The warning signal of a time limit or a preemption (Slurm's `--signal`): ignored by the agent and,
inherited, by torchrun (which an unhandled SIGUSR2 would kill); the trainer handles it. A container's
job (launch.json `warning_blocked`) starts with it blocked as well: Slurm signals every process of
the step, and podman's conmon, re-parented to the agent (a subreaper) and so in the step, would die
of it (its default action; the runtime's client resets what it handled); blocked, conmon keeps it
blocked, and `warned.py` unblocks it inside the container."""
STARTING_TEXT = "agent {pid} on {host} starting{attempt}: {argv} (cwd {cwd})"
"""The agent's first line of a launch (an attempt of a run: node.log continues across retries)."""
STARTING_LINE = re.compile(r"^agent \d+ on \S+ starting(?: attempt \d+)?: ")
STOPPING = "agent received {signal}: stopping the job, SIGTERM to process group {pgid}"
"""The agent's line (stream `orch`) written just before it signals the job on a stop: everything the
job prints after it is the stop's doing (an attached `orch up` keeps it out of the live log)."""
STOPPING_PREFIX = "agent received "
EXITED = "torchrun exited with code {code}{signal}: {state}"
"""The agent's last line about the job: how torchrun ended and the state that makes the run."""
EXITED_LINE = re.compile(r"^torchrun exited with code (-?\d+)(?: \((SIG[A-Z0-9]+)\))?: ([a-z]+)$")
WORKER_FAILED = re.compile(r"\bfailed \(exitcode: -?\d+\) local_rank: \d+ \(pid: \d+\)")
"""torchrun's own log line (stderr, no rank prefix) when it sees a worker exit non-zero, in every
torch 2.x: `E1130 10:02:37.403000 6342 .../api.py:1002] failed (exitcode: 3) local_rank: 1 (pid: 6482)
of binary: ...` (older: `ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) ...`).
When the first one came is state.json `failed_at`: the order of a run's failures. A victim rank (its
collective broke when the first rank died) fails later than the rank it died of, but its torchrun
may well exit first: torchrun's own exit, after its summary and its interpreter's teardown, is the
noisier clock."""


def shown(argv: list[str]) -> str:
    """An argv as one line a shell would read back: each word quoted when it needs it, and a word
    holding a newline or another control character as `$'...'` with it escaped (one log line)."""
    return " ".join(
        shlex.quote(a)
        if a.isprintable()
        else "$'" + a.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"
        for a in argv
    )


# ----------------------------------------------------------------------------- small helpers


def utc_now(when: float | None = None) -> str:
    """Node-side UTC time with microseconds, now or at `when` (epoch s): `2026-11-30T09:32:05.123456Z`."""
    at = datetime.now(timezone.utc) if when is None else datetime.fromtimestamp(when, timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


FULL = (28, 122)
"""ENOSPC, EDQUOT: a write refused because the run root's disk (or the user's quota) is full."""
RESERVE = 4096
"""state.json is padded (JSON allows trailing whitespace) to hold this much more in the blocks it
already has, so that on a full disk it can still be rewritten in place (`write_json`)."""


def write_json(path: str, data: dict[str, Any]) -> OSError | None:
    """Atomic, private rewrite: readers never see a torn state.json. On a full disk (`FULL`) the
    file is rewritten in place, in the blocks it has (its padding keeps `RESERVE` bytes in hand),
    and the error that made it so is returned; OSError when even that cannot be done."""
    raw = (json.dumps(data, sort_keys=False) + "\n").encode("utf-8")
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.unlink(tmp)  # a leftover of a crash of this pid's namesake (never followed: unlink)
    except FileNotFoundError:
        pass
    try:
        with os.fdopen(create_private(tmp), "wb") as fh:
            fh.write(raw + b" " * (RESERVE - 1) + b"\n")
        os.replace(tmp, path)
        return None
    except OSError as exc:
        try:
            os.unlink(tmp)  # a half-written copy holds blocks a full disk has not got
        except OSError:
            pass
        if exc.errno not in FULL or not rewrite_in_place(path, raw):
            raise
        return exc


def rewrite_in_place(path: str, raw: bytes) -> bool:
    """`raw` over the file's own blocks, padded to its size; False where it does not fit."""
    try:
        fd = os.open(path, os.O_WRONLY | NOFOLLOW)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        if len(raw) + 1 > size:
            return False
        os.pwrite(fd, raw[:-1] + b" " * (size - len(raw)) + b"\n", 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def full_text(run_dir: str, exc: OSError) -> str:
    """What the user is told of a write the disk refused: the run root (`<run_root>/<run>/<node>`) is full."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))
    return f"run_root {root} is full ({exc.strerror or exc}): the node's log and state are not all written"


def owner(run_dir: str) -> str | None:
    """The nonce that claimed the directory (`launch.nonce`); None where there is none."""
    try:
        with open(os.path.join(run_dir, OWNER), encoding="ascii") as fh:
            return fh.read().strip() or None
    except (OSError, ValueError):
        return None


def foreign(run_dir: str, nonce: str | None, strict: bool = False) -> str | None:
    """Why the directory is not the launch `nonce`'s (another controller's run of the same id), or
    None: it is, or nothing was started in it, or no nonce is asked. Without `launch.nonce`, a
    state.json's `nonce` decides; `strict` (a launch about to write there) also refuses a
    directory that holds a run but says no nonce at all (an older orch's run of this id)."""
    if not nonce:
        return None
    held = owner(run_dir)
    if held == nonce:
        return None
    if held is None:
        state = read_json(os.path.join(run_dir, STATE))
        if not state and not os.path.exists(os.path.join(run_dir, LOG)):
            return None
        held = state.get("nonce")
        if held == nonce or (held is None and not strict):
            return None
    state = read_json(os.path.join(run_dir, STATE))
    what = "a run of the same id started by another orch up (another $ORCH_HOME or user)"
    if state.get("state"):
        what += f", {state.get('state')}"
        if state.get("agent_pid") and state.get("state") not in FINAL_STATES:
            what += f" (agent {state.get('agent_pid')})"
    return f"{run_dir} holds {what}"


def claim(run_dir: str, nonce: str) -> str | None:
    """Claim the run directory for the launch `nonce` before anything is written in it: the
    first launch to create `launch.nonce` (atomically, with its content: a hard link) owns it,
    later attempts of the same launch find their own nonce. None when claimed, else why not."""
    why = foreign(run_dir, nonce, strict=True)
    if why:
        return why
    if owner(run_dir) == nonce:
        return None
    tmp = os.path.join(run_dir, f"{OWNER}.tmp.{os.getpid()}")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    with os.fdopen(create_private(tmp), "w", encoding="ascii") as fh:
        fh.write(nonce + "\n")
    try:
        os.link(tmp, os.path.join(run_dir, OWNER))
    except FileExistsError:
        pass  # a launch racing this one got there first: whose it is decides below
    finally:
        os.unlink(tmp)
    return foreign(run_dir, nonce, strict=True)


# ----------------------------------------------------------------------------- the daemon


MAX_LINE = 1 << 20
"""The longest line of output node.log holds whole: a longer one (a job that prints a tensor, a
progress bar without newlines) is written in pieces of at most this many bytes, each but the last
ending with LONG_LINE_MARK, so one line never holds up the log or grows without bound."""
LONG_LINE_MARK = " [orch: line longer than 1 MiB, continued on the next line]"


STREAMS = OUT, ERR, OWN = ("out", "err", "orch")
"""node.log's streams: the job's stdout, its stderr, and the agent's own lines."""
ROLE = r"[A-Za-z_][A-Za-z_-]*?"
"""A torchrun role as node.log's worker field holds it (`--role`; `default` unless given)."""


def worker_pattern(role: str = ROLE) -> str:
    """The worker field of a node.log line (a regular expression; group 1: the local rank): `role`
    (a pattern: `ROLE`, or one role escaped) and the worker's local rank in torchrun's `--tee`
    prefix's brackets, `[default0]:`."""
    return r"\[" + role + r"(\d+)\]:"


WORKER_FIELD = worker_pattern()
"""The one grammar of a worker's line in node.log: its text starts with `[<role><local rank>]:`
(group 1: the local rank), written by the agent (`worker_field`) from what it read of torchrun's
`--tee` output with this same pattern, so it is torchrun's prefix byte for byte and node.logs of any
version read alike. orch's readers take it from here (`logs/lines.py`, `run/cause.py`,
`run/supervise.py`); the C merge (`logs/_fastmerge.c`) is held to it by tests/unit/test_logs_fastmerge.py,
and tests/unit/test_one_definition_logs.py fails on a second copy."""
TEE_HEAD = re.compile(WORKER_FIELD.encode())
"""`WORKER_FIELD` as the agent reads torchrun's output: bytes."""


def worker_field(role: bytes, local_rank: bytes) -> bytes:
    """The field that starts a worker's line in node.log (`WORKER_FIELD`): the role and the local
    rank's digits as read (never through int(): Python refuses a number of over 4300 digits)."""
    return b"[" + role + local_rank + b"]:"


class Rejoin:
    """torchrun's `--tee` output with each worker's lines whole again. torchrun tails every
    worker's log file and writes what it reads with the worker's prefix first; where the worker
    has written only part of a line so far (a `print` under PYTHONUNBUFFERED writes its text and
    its newline in two writes; C stdio flushes a full buffer mid-line), the tail writes that part,
    and the rest later, under the prefix again. Another worker's line then lands in between:
    `[default0]:seq=5[default1]:seq=5` and, later, `[default0]:` (recorded in
    tests/fixtures/torchrun_tee3_torn_line_stdout_torch2.14.txt). Fed the stream's lines, this holds each
    worker's unfinished part under its prefix until the rest comes. A line that does not start
    with a prefix is passed on as it is; within a line, only the role of its first prefix marks a
    part's end, so a worker's text that quotes another prefix is cut there (the price of the rule)."""

    def __init__(self) -> None:
        self.parts: dict[bytes, bytes] = {}
        """Each worker field's part of a line not yet ended."""
        self.heads: dict[bytes, re.Pattern[bytes]] = {}
        """Per role: the pattern of its prefixes."""

    def feed(self, raw: bytes) -> list[bytes]:
        """The whole lines `raw` (one line as read, newline and all) ends, a worker's behind its
        field (`worker_field`)."""
        first = TEE_HEAD.match(raw)
        if first is None:
            return [raw]
        role = raw[1 : first.start(1)]
        head = self.heads.get(role)
        if head is None:
            head = self.heads[role] = re.compile(worker_pattern(re.escape(role.decode("ascii"))).encode())
        marks = list(head.finditer(raw))
        done: list[bytes] = []
        for mark, end in zip(marks, [*(m.start() for m in marks[1:]), len(raw)]):
            prefix = worker_field(role, mark.group(1))
            text = self.parts.pop(prefix, b"") + raw[mark.end() : end]
            if end == len(raw):
                done.append(prefix + text)
                continue
            while len(text) >= MAX_LINE:  # a part that does not end (a progress bar's returns): in pieces
                cut = utf8_boundary(text[:MAX_LINE])
                done.append(prefix + text[:cut] + LONG_LINE_MARK.encode())
                text = text[cut:]
            self.parts[prefix] = text  # the rest comes later
        return done

    def rest(self) -> list[bytes]:
        """The parts never ended (the stream ended first), each as a line."""
        rest = [prefix + text for prefix, text in self.parts.items()]
        self.parts.clear()
        return rest


class NodeLog:
    """node.log: one timestamped line per output line, written by several threads."""

    def __init__(self, path: str) -> None:
        import threading

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)
        self.fh = os.fdopen(fd, "ab", buffering=0)
        self.lock = threading.Lock()
        self.failed_at: float | None = None
        """When torchrun first said a worker failed (`WORKER_FAILED`, on stderr): this line's stamp."""
        self.lost = 0
        """Lines not written since the last one that was (a full disk): said once writes work again."""
        self.error: OSError | None = None
        """Why the last write failed, while writes fail; None once one works."""
        self.torn = False
        """A failed write left part of its line in node.log: the next one ends it first."""

    def write(self, stream: str, text: str) -> None:
        """One stamped line. A write the disk refuses never stops the agent nor the job's output
        (the pumps keep draining it): the line is lost and counted, said once writes work again."""
        text = text.rstrip("\r\n")
        body = f" {stream} {text}\n".encode("utf-8", "replace")
        with self.lock:  # stamp under the lock: the file's order is then the stamps' order
            now = time.time()
            line = utc_now(now).encode() + body
            if self.lost:  # what was lost first (after the end of a line cut short, if one was)
                line = (
                    b"\n" * self.torn
                    + utc_now(now).encode()
                    + f" orch {self.lost} lines of output lost: "
                    f"{self.error.strerror if self.error else 'write failed'}\n".encode()
                    + line
                )
            written = 0
            try:
                while written < len(line):  # write(2) may take fewer bytes than asked (a nearly full disk)
                    written += self.fh.write(line[written:])
            except OSError as exc:
                self.lost += 1
                self.error = exc
                self.torn = written > 0 or self.torn
            else:
                self.lost, self.error, self.torn = 0, None, False
            if self.failed_at is None and stream == ERR and not text.startswith("[") and WORKER_FAILED.search(text):
                self.failed_at = now  # a rank's own lines start with their field, `[default0]:`

    def pump(self, src: IO[bytes], stream: str) -> None:
        """Copy `src` line by line, stamping each line when it arrives, with torchrun's torn
        worker lines rejoined (`Rejoin`); a line longer than MAX_LINE bytes in pieces, cut between
        characters, never inside one."""
        whole = Rejoin()
        carry = b""
        while True:
            raw = carry + src.readline(MAX_LINE - len(carry))
            carry = b""
            if not raw:
                break
            if raw.endswith(b"\n") or len(raw) < MAX_LINE:
                for line in whole.feed(raw):
                    self.write(stream, line.decode("utf-8", "replace"))
                continue
            cut = utf8_boundary(raw)
            carry = raw[cut:]
            self.write(stream, raw[:cut].decode("utf-8", "replace") + LONG_LINE_MARK)
        for line in whole.rest():
            self.write(stream, line.decode("utf-8", "replace"))
        src.close()


def write_all(fh: Any, data: bytes) -> None:
    """Write all of `data` to an unbuffered file: write(2) may take fewer bytes than asked (a
    signal, a nearly full disk), and the rest must not be lost without a word."""
    view = memoryview(data)
    while view:
        view = view[fh.write(view) :]


def utf8_boundary(data: bytes) -> int:
    """The length of `data` less a UTF-8 character cut off at its end (at most 3 bytes)."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: an ASCII byte, or the lead of a character
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
            return end - back if need > back else end
    return end


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
        lease = launch.get("lease_s")
        self.lease_s = float(lease) if isinstance(lease, (int, float)) and lease > 0 else None
        self.lease_lost: str | None = None
        self.unsaved = False
        """state.json is behind `state` (a full disk): written again with the next snapshot."""
        self.full: str | None = None
        """What the last write the disk refused says (`full_text`)."""
        self.lease_seen: tuple[int, float] | None = None
        """The lease file's mtime (ns) as last seen, and when it was seen on `boot_clock`."""

    def start_lease(self) -> None:
        """A fresh lease file: the controller renews it from now on (its log reader's stdin)."""
        path = os.path.join(self.dir, LEASE)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(create_private(path))
        self.lease_seen = None

    def check_lease(self) -> None:
        """Stop the job (as SIGTERM would) once the controller has not renewed the lease for `lease_s`.

        The lease's age is measured on the node's boot clock (`boot_clock`), never the wall clock:
        a renewal is any change of the lease file's mtime (forward or back), and its age is how long
        ago, on that clock, this agent first saw the mtime it has now. An NTP step or a manual clock
        change during a week-long run neither expires a lease that is being renewed nor keeps one
        that is not."""
        if self.lease_s is None or self.stop_at is not None:
            return
        try:
            mtime = os.stat(os.path.join(self.dir, LEASE), follow_symlinks=False).st_mtime_ns
        except OSError:
            return
        now = boot_clock()
        if self.lease_seen is None or self.lease_seen[0] != mtime:
            self.lease_seen = (mtime, now)
            return
        age = now - self.lease_seen[1]
        if age > self.lease_s:
            self.lease_lost = (
                f"the controller (orch up) was not heard from for {age:.0f} s (lease {self.lease_s:g} s): "
                "a cut link or a dead controller; the job was stopped"
            )
            self.log.write(OWN, self.lease_lost)
            self.stop_at, self.stop_signal = time.monotonic(), signal.SIGTERM

    def save(self, **fields: Any) -> None:
        """state.json with `fields`. A full disk never takes the agent down: state.json is
        rewritten in place (`write_json`), with `disk_full` saying so, else kept here and written
        again with the next snapshot; `disk_full` goes once a whole write works again."""
        self.state.update(fields)
        path = os.path.join(self.dir, STATE)
        for _ in range(2):
            try:
                refused = write_json(path, self.state)
            except OSError as exc:
                self.unsaved = True
                self.note_full(exc)
                return
            if refused is not None:
                self.note_full(refused)
            said = self.full if refused is not None else None
            if self.state.get("disk_full") == said:
                break
            self.state["disk_full"] = said
        self.unsaved = refused is not None

    def note_full(self, exc: OSError) -> None:
        """Say once in node.log (if it can still take a line) why a write failed."""
        text = full_text(self.dir, exc) if exc.errno in FULL else f"cannot write {STATE}: {exc.strerror or exc}"
        if text != self.full:
            self.full = text
            self.log.write(OWN, text)

    def on_signal(self, signum: int, _frame: Any) -> None:
        # only set a flag: writing the log here could deadlock on its lock
        if self.stop_at is None:
            self.stop_at = time.monotonic()
            self.stop_signal = signum

    def argv(self) -> list[str]:
        """The plan's argv as it is, but for what only the node knows (`node_values`)."""
        return fill(self.launch["argv"], self.dir)

    def run_stop_hook(self, why: str) -> None:
        """The plan's stop hook (state.json `stop_hook`), once per call: what stops the job's
        parts that its process group does not hold (a container). Bounded; its answer logged and
        recorded (state.json `stop_hook_result`)."""
        hook = self.state.get("stop_hook") or []
        if hook:
            self.log.write(OWN, f"stop hook ({why}): {' '.join(hook)}")
            said = run_hook(hook, self.hook_env())
            self.log.write(OWN, "stop hook: " + said)
            self.save(stop_hook_result=said)

    def hook_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in self.launch.get("env", {}).items()})
        return env

    def run(self) -> int:
        import ctypes
        import socket
        import subprocess
        import threading

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            self.log.write(OWN, "cannot become a child subreaper; orphaned workers may escape")
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        # the warning of a time limit or a preemption (Slurm signals every process of a step): the
        # agent ignores it and torchrun inherits that; the trainer's handler is the one that acts on it
        signal.signal(WARNING, signal.SIG_IGN)
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in self.launch.get("env", {}).items()})
        argv = self.argv()
        if self.launch.get("torchrun_log_dir"):
            try:  # private like the rest of the run directory (torchrun would make it with the job's umask)
                os.mkdir(os.path.join(self.dir, "torchrun"), 0o700)
            except FileExistsError:
                pass
        cwd = expand(self.launch.get("cwd")) or os.path.expanduser("~")
        attempt = str(self.launch.get("env", {}).get("ORCH_ATTEMPT", "1"))
        if self.lease_s is not None:
            self.start_lease()
        self.log.write(
            OWN,
            STARTING_TEXT.format(
                pid=os.getpid(),
                host=socket.gethostname(),
                attempt="" if attempt == "1" else f" attempt {attempt}",
                argv=shown(argv),
                cwd=shown([cwd]),
            ),
        )
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {WARNING}) if self.launch.get("warning_blocked") else None
        try:
            umask = self.launch.get("login_umask")
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=None if umask is None else (lambda: os.umask(umask)),
            )
        except OSError as exc:
            reason = f"cannot start {argv[0]}: {exc.strerror or exc}"
            self.log.write(OWN, reason)
            self.save(state=FAILED, exit_code=127, reason=reason, finished_at=time.time())
            return 127
        finally:
            if blocked is not None:  # the job inherited it; the agent keeps only ignoring it
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        # torchrun leads a session and process group of its own: its start time names both
        st = proc_start_time(proc.pid, zombie=True)  # a job may be done already: not yet reaped
        self.save(state=RUNNING, pid=proc.pid, pgid=proc.pid, pid_start=st, pgid_start=st, started_at=time.time())
        self.log.write(OWN, f"started pid {proc.pid} (process group {proc.pid})")
        pumps = [
            threading.Thread(target=self.log.pump, args=(s, n), daemon=True)
            for s, n in ((proc.stdout, OUT), (proc.stderr, ERR))
        ]
        for t in pumps:
            t.start()
        sampling = self.start_telemetry()
        try:
            code = self.watch(proc)
        finally:  # torchrun's end (or the agent's own error): nothing of the job may outlive it
            self.run_stop_hook("torchrun exited")
        if sampling is not None:
            sampling.set()
        ended = time.time()  # when torchrun exited: the first-failure order, not when cleanup ended
        left = self.cleanup(proc.pid)
        for t in pumps:
            # EOF comes as soon as no writer is left; every process of the job is gone by now, so
            # a pipe still open is held by something outside the job: do not wait on it for long
            t.join(timeout=2)
        stopped = self.stop_at is not None or os.path.exists(os.path.join(self.dir, STOP_REQUEST))
        state = STOPPED if stopped else (SUCCEEDED if code == 0 else FAILED)
        sig = signal_name(code)
        self.log.write(OWN, EXITED.format(code=code, signal=f" ({sig})" if sig else "", state=state))
        extra = {"reason": self.lease_lost, "lease_expired": True} if self.lease_lost else {}
        if self.log.failed_at is not None:
            extra["failed_at"] = self.log.failed_at
        self.save(
            state=state,
            exit_code=code,
            signal=sig,
            finished_at=ended,
            procs=[[p, s] for p, s in left],
            cleanup_left=[p for p, _s in left],
            **extra,
        )
        return code

    def start_telemetry(self) -> threading.Event | None:
        """Every `telemetry_s` seconds (launch.json; 0 or missing: never) a telemetry line of the
        node's GPUs, CPU, memory and ranks (`telemetry.py`), in a thread of its own: a slow
        nvidia-smi delays only the next sample. Returns the event that ends it."""
        import threading

        every = float(self.launch.get("telemetry_s") or 0)
        if every <= 0:
            return None
        try:
            from . import telemetry
        except ImportError:
            import telemetry  # type: ignore[no-redef]
        done = threading.Event()
        me = os.getpid()
        run, node, nonce = self.launch.get("run"), self.launch.get("node"), self.launch.get("nonce")

        def job_pids() -> list[int]:
            """The job's processes: the agent's descendants, and those carrying this launch's
            identity outside its tree (a container runtime's: conmon's or containerd-shim's
            children, which hold ORCH_RUN_ID, ORCH_NODE and ORCH_LAUNCH, passed in by name)."""
            pids = {pid for pid, _st in descendants(me)}
            if run and node:
                pids.update(marked(str(run), str(node), str(nonce) if nonce else None))
            return sorted(pids)

        sampler = telemetry.Sampler(job_pids)

        def loop() -> None:
            failures = 0
            wait = min(every, 2.0)  # the first soon after the start (its CPU shares are still null)
            while not done.wait(wait):
                wait = every
                try:
                    self.log.write(OWN, telemetry.line(sampler.sample()))
                    failures = 0
                except Exception as exc:  # telemetry never takes the agent down; said once in a row
                    if failures == 0:
                        self.log.write(OWN, f"telemetry sample failed: {type(exc).__name__}: {exc}")
                    failures += 1

        threading.Thread(target=loop, name="telemetry", daemon=True).start()
        return done

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
                # the line first: what the job prints once signalled comes after it in node.log
                self.log.write(OWN, STOPPING.format(signal=signal.Signals(self.stop_signal).name, pgid=proc.pid))
                try:  # torchrun is our child, not reaped yet: its group cannot be anyone else's
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
            if self.term_sent is not None and not self.kill_sent and now - self.term_sent > self.grace:
                self.kill_sent = True
                self.log.write(OWN, f"still running {self.grace:.0f} s after SIGTERM: SIGKILL")
                self.run_stop_hook("still running after SIGTERM")
                self.kill_tree(signal.SIGKILL)
            if now - last_snapshot >= 1.0:
                last_snapshot = now
                self.snapshot()
                self.check_lease()
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
        if procs != self.state.get("procs") or self.unsaved:
            self.save(procs=procs)
        if self.log.error is not None and self.log.error.errno in FULL and self.state.get("disk_full") is None:
            self.save(disk_full=full_text(self.dir, self.log.error))  # node.log is what found it

    def kill_tree(self, sig: int) -> int:
        """Signal every process below the agent (each by pid and start time); how many got it."""
        return sum(send(pid, st, sig) for pid, st in descendants(os.getpid()))

    def cleanup(self, main_pid: int, kill_wait: float = 5.0) -> list[tuple[int, int]]:
        """Leave nothing behind: whatever torchrun left (orphaned workers) gets TERM, then KILL.
        Returns what is still there after that (pid, start time): reported, never assumed gone."""
        if not descendants(os.getpid()):
            return []
        n = self.kill_tree(signal.SIGTERM)
        self.log.write(OWN, f"torchrun exited, {n} of its processes remain: SIGTERM")
        deadline = time.monotonic() + min(self.grace, 5.0)
        while descendants(os.getpid()) and time.monotonic() < deadline:
            self.reap(main_pid)
            time.sleep(0.1)
        n = self.kill_tree(signal.SIGKILL)
        if n:
            self.log.write(OWN, f"SIGKILL to {n} remaining processes")
        deadline = time.monotonic() + kill_wait
        while descendants(os.getpid()) and time.monotonic() < deadline:
            self.reap(main_pid)
            time.sleep(0.05)
        self.reap(main_pid)
        left = descendants(os.getpid())
        if left:
            self.log.write(
                OWN,
                f"cleanup timed out: {len(left)} processes of the job survived SIGKILL for "
                f"{kill_wait:.0f} s: {' '.join(str(p) for p, _s in left)}",
            )
        return left


def boot_clock() -> float:
    """Seconds since the node booted (CLOCK_BOOTTIME, read from /proc/uptime): a count no wall
    clock step moves (nor a time shim preloaded into the agent, libfaketime), which also runs while
    the node is suspended; `time.monotonic()` where /proc is not there."""
    try:
        with open("/proc/uptime", "rb") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.monotonic()


NODE_VALUES = ("{ORCH_RUN_DIR}", "{ORCH_UID}", "{ORCH_GID}", "{ORCH_HOME}")
"""What only the node knows, written into launch.json's argv and stop hook by the plan
(orchestrator/config/plan.py `NODE_VALUES`): these names, and nothing else, are filled in."""
HOOK_TIMEOUT_S = 60.0
"""How long the stop hook may take (a `docker rm -f` of a container that holds GPUs)."""


def node_values(run_dir: str) -> dict[str, str]:
    return {
        "{ORCH_RUN_DIR}": run_dir,
        "{ORCH_UID}": str(os.getuid()),
        "{ORCH_GID}": str(os.getgid()),
        "{ORCH_HOME}": os.path.expanduser("~"),
    }


def fill(argv: Any, run_dir: str) -> list[str]:
    """`argv` with every `NODE_VALUES` name in it replaced by this node's value."""
    values = node_values(run_dir)
    out = []
    for arg in argv or ():
        arg = str(arg)
        for name, value in values.items():
            arg = arg.replace(name, value)
        out.append(arg)
    return out


def run_hook(argv: list[str], env: dict[str, str] | None = None, timeout: float = HOOK_TIMEOUT_S) -> str:
    """Run a stop hook to its end (or `timeout`): what it said, in one line. Never raises.

    It runs without the job's identity in its environment (`procs.IDENTITY`): a stop finds the
    job's processes by it, and would SIGKILL the hook at the end of its grace, container left."""
    import subprocess

    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=without_identity(os.environ if env is None else env),
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return f"no end within {timeout:.0f} s"
    except OSError as exc:
        return f"cannot run {argv[0]}: {exc.strerror or exc}"
    said = proc.stdout.decode("utf-8", "replace").strip().replace("\n", " | ")[-500:]
    return f"exit {proc.returncode}" + (f": {said}" if said else "")


def expand(path: str | None) -> str | None:
    """A leading `~/` means this login's home (no shell expands it for us)."""
    if path and (path == "~" or path.startswith("~/")):
        return os.path.expanduser(path)
    return path


# ----------------------------------------------------------------------------- subcommands


def cmd_start(run_dir: str, wait: float, foreground: bool = False) -> int:
    """Validate, daemonize, and report once torchrun runs (or why it could not start). `foreground`:
    the agent runs in this process, which something else holds as long as the job (a Slurm step):
    the same answer once torchrun runs, then the agent's own run to its end (`serve_here`)."""
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
    write_json(
        state_path,
        {
            "run": launch.get("run"),
            "node": launch.get("node"),
            "nonce": launch.get("nonce"),
            "stop_hook": fill(launch.get("stop_hook"), run_dir),
            "agent_pid": None,
            "pid": None,
            "pgid": None,
            "host": socket.gethostname(),
            "boot_id": boot_id(),
            "started_at": None,
            "finished_at": None,
            "exit_code": None,
            "signal": None,
            "state": STARTING,
        },
    )
    if foreground:
        return serve_here(run_dir, launch, state_path, wait)
    if os.fork() == 0:
        daemon(run_dir, launch)
    return wait_started(state_path, wait)


def serve_here(run_dir: str, launch: dict[str, Any], state_path: str, wait: float) -> int:
    """The agent in the foreground: its start's answer (`wait_started`, on stdout, from a thread) once
    torchrun runs, and the agent's run in this process until the job is over. Exit 1 only when the
    job failed (a Slurm step's `--kill-on-bad-exit` then ends the other nodes' agents): a job stopped
    on request (orch down, a teardown, the lease) exits 0 and leaves the other nodes to their own stop."""
    import threading

    answer = threading.Thread(target=wait_started, args=(state_path, wait), daemon=True, name="answer")
    answer.start()
    os.chdir("/")
    launch = dict(launch, login_umask=os.umask(0o077))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    code = serve(run_dir, launch)
    answer.join(timeout=wait)
    sys.stdout.flush()
    return 1 if code != 0 and read_json(state_path).get("state") == FAILED else 0


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
    os._exit(0 if serve(run_dir, launch) == 0 else 1)


def serve(run_dir: str, launch: dict[str, Any]) -> int:
    """The agent's run (`Monitor.run`), daemonized or in the foreground: torchrun's exit code, or 1
    when the agent itself crashed (said in state.json and node.log first)."""
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
            if state.get("stop_hook"):
                state["stop_hook_result"] = run_hook([str(a) for a in state["stop_hook"]])
            state.update(state=FAILED, finished_at=time.time(), reason=f"agent crashed: {type(exc).__name__}: {exc}")
            write_json(os.path.join(run_dir, STATE), state)
        except BaseException:
            pass
        try:
            NodeLog(os.path.join(run_dir, LOG)).write(OWN, "agent crashed: " + trace)
        except BaseException:
            pass
    return code


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


def status(run_dir: str, tail: int = 0, nonce: str | None = None, renew: bool = False) -> dict[str, Any]:
    """state.json plus what only the node can tell: liveness, log size and time, the log's tail.
    With `nonce`, a directory another launch claimed says only that (`foreign`); with `renew`
    (the supervising `orch up`'s polls), the run's lease is renewed too."""
    why = foreign(run_dir, nonce)
    if why:
        return {
            "state": None,
            "exists": False,
            "foreign": True,
            "error": why,
            "agent_alive": False,
            "job_alive": False,
            "now": time.time(),
        }
    if renew:
        try:
            os.utime(os.path.join(run_dir, LEASE), follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass
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


def cmd_stop(run_dir: str, grace: float, nonce: str | None = None) -> int:
    """SIGTERM the job, SIGKILL it after `grace`, wait until nothing of it is left. Idempotent.

    What it reports is what it saw afterwards, not what it sent: `stopped` (processes of the job
    found at the start and gone now), `remaining` (still there: the job's, or the agent), and
    `strangers` (processes under the recorded ids that are not the job's: never signalled).
    With `nonce`, a directory another launch claimed is left alone (`foreign`)."""
    why = foreign(run_dir, nonce)
    if why:
        return emit(
            {
                "state": None,
                "stopped": [],
                "remaining": [],
                "strangers": [],
                "foreign": True,
                "note": why + ": left alone",
            },
            0,
        )
    state_path = os.path.join(run_dir, STATE)
    state = read_json(state_path)
    if not state:
        return emit(
            {"state": None, "stopped": [], "remaining": [], "strangers": [], "note": "nothing was started here"}, 0
        )
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
    # signal first, record after: a stop never needs a byte of disk (a full run root)
    unwritten: list[str] = []
    if state.get("state") not in FINAL_STATES:
        try:
            fd = os.open(os.path.join(run_dir, STOP_REQUEST), os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(utc_now() + "\n")
        except OSError as exc:
            unwritten.append(full_text(run_dir, exc) if exc.errno in FULL else f"{STOP_REQUEST}: {exc.strerror or exc}")
    deadline = time.monotonic() + grace
    while job.processes()[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = job.signal(signal.SIGKILL)
    # the agent runs the plan's stop hook (a container's removal can take seconds) before it exits
    deadline = time.monotonic() + 5.0 + (HOOK_TIMEOUT_S if state.get("stop_hook") and agent[0] else 0.0)
    while (job.processes()[0] or alive(*agent)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left, more_strangers = job.processes()
    strangers.update(more_strangers)
    remaining = sorted(left) + ([agent[0]] if agent[0] and alive(*agent) else [])
    state = read_json(state_path) or state  # (rewritten in place on a full disk, it may read torn for an instant)
    if state.get("state") not in FINAL_STATES and not agent_alive(state):
        # the agent was gone (killed): its stop hook and the end are ours to do and record, so
        # the run neither looks alive nor leaves what its process group did not hold
        if state.get("stop_hook"):
            env = dict(os.environ)
            env.update({str(k): str(v) for k, v in read_json(os.path.join(run_dir, LAUNCH)).get("env", {}).items()})
            said = run_hook([str(a) for a in state["stop_hook"]], env)
            NodeLog(os.path.join(run_dir, LOG)).write(OWN, f"stop hook (the agent was gone): {said}")
            state["stop_hook_result"] = said
        state.update(state=STOPPED, finished_at=time.time(), procs=[])
        try:
            write_json(state_path, state)
        except OSError as exc:
            unwritten.append(full_text(run_dir, exc) if exc.errno in FULL else f"{STATE}: {exc.strerror or exc}")
    out = dict(
        state,
        stopped=sorted(p for p in found if p not in left),
        killed=sorted(killed),
        remaining=remaining,
        strangers=sorted(strangers),
    )
    if unwritten:
        out["disk_full"] = unwritten[0]
    return emit(out, 0 if not remaining else 1)


def under_root(run_dir: str, root: str) -> str | None:
    """Why `run_dir` is not a run directory of `root` (`<root>/<run-id>/<node>`, links resolved),
    or None: nothing outside the run root is ever removed."""
    real, top = os.path.realpath(run_dir), os.path.realpath(expand(root) or root)
    rel = os.path.relpath(real, top)
    parts = rel.split(os.sep)
    if rel.startswith(os.pardir) or len(parts) != 2 or os.curdir in parts or os.pardir in parts:
        return (
            f"{real} is not a run directory of the run root {top} (<run_root>/<run-id>/<node>): refusing to remove it"
        )
    return None


def cmd_collect(run_dir: str, root: str, limit: int, remove: bool, nonce: str | None = None) -> int:
    """The last `limit` bytes of node.log; with `remove`, then the run directory is removed (and
    the run id's directory above it, once empty), only where `under_root` finds it in the run
    root, it is this launch's (`nonce`), and neither its agent nor its job runs any more: a check's
    run directory once its job is done (`preflight/fabric/job.py`). The run directory's trust was
    judged by `main` (`check_run_dir`) before anything is read."""
    out: dict[str, Any] = {"log": "", "removed": False}
    try:
        with open(os.path.join(run_dir, LOG), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            out["log"] = fh.read().decode("utf-8", "replace")
    except OSError:
        pass
    if not remove:
        return emit(out, 0)
    state = read_json(os.path.join(run_dir, STATE))
    why = under_root(run_dir, root) or foreign(run_dir, nonce)
    if not why and (agent_alive(state) or job_alive(state)):
        why = f"{run_dir}: its job or agent still runs: refusing to remove it"
    if why:
        out["kept"] = why
        return emit(out, 0)
    import shutil

    os.chdir("/")
    shutil.rmtree(run_dir, ignore_errors=True)
    out["removed"] = not os.path.lexists(run_dir)
    try:
        os.rmdir(os.path.dirname(run_dir))  # the run id's directory, once every node's is gone
    except OSError:
        pass
    return emit(out, 0)


FULL_ID = re.compile(r"^[0-9a-f]{64}\Z")
"""A container's whole ID, as `ps -q --no-trunc` prints it: the only words `sweep` removes."""
SWEEP_LIST_S, SWEEP_REMOVE_S = 60.0, 120.0


def cmd_sweep(spec_text: str) -> int:
    """List a launch's containers left on this node and remove them (`sweep` above). The listing
    and the removal are argvs the controller derived from the run's inventory snapshot; they run
    here without a shell or a login, so nothing but the runtime's own answer is read, and only
    its full IDs are removed, after `--`."""
    import subprocess

    try:
        spec = json.loads(spec_text)
        listing, remove = [str(w) for w in spec["list"]], [str(w) for w in spec["remove"]]
    except (ValueError, KeyError, TypeError):
        return emit({"error": 'sweep: --spec is not {"list": [...], "remove": [...]}'}, 2)
    if not listing or not remove:
        return emit({"error": "sweep: an empty listing or removal"}, 2)

    def run(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
        try:
            res = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=without_identity(os.environ),
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return None, "", f"no answer within {timeout:.0f} s"
        except OSError as exc:
            return None, "", f"cannot run {argv[0]}: {exc.strerror or exc}"
        return res.returncode, res.stdout.decode("utf-8", "replace"), res.stderr.decode("utf-8", "replace")

    def last(err: str, code: int | None) -> str:
        lines = err.strip().splitlines()
        return lines[-1][:500] if lines else f"exit {code}"

    code, out, err = run(listing, SWEEP_LIST_S)
    if code != 0:
        return emit({"error": f"cannot list the run's containers: {last(err, code)}"}, 1)
    words = [line.strip() for line in out.splitlines() if line.strip()]
    ids = list(dict.fromkeys(w for w in words if FULL_ID.match(w)))
    ignored = [w[:80] for w in words if not FULL_ID.match(w)]
    if not ids:
        return emit({"containers": [], "ignored": ignored}, 0)
    code, _, err = run([*remove, "--", *ids], SWEEP_REMOVE_S)
    if code != 0:
        return emit(
            {"containers": ids, "ignored": ignored, "error": f"cannot remove {' '.join(ids)}: {last(err, code)}"}, 1
        )
    return emit({"containers": ids, "ignored": ignored, "removed": True}, 0)


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
    p.add_argument("--foreground", action="store_true", help="run the agent in this process until the job ends")
    p = sub.add_parser("status", help="state.json plus liveness")
    p.add_argument("dir")
    p.add_argument("--tail", type=int, default=0, help="also return the last N lines of node.log")
    p.add_argument("--nonce", help="the launch's nonce: another launch's directory only says so")
    p.add_argument("--renew", action="store_true", help="renew the run's lease (the supervising orch up)")
    p = sub.add_parser("stop", help="stop the job (TERM, then KILL after --grace) and wait")
    p.add_argument("dir")
    p.add_argument("--grace", type=float, default=10.0)
    p.add_argument("--nonce", help="the launch's nonce: another launch's directory is left alone")
    p = sub.add_parser("stacks", help="the Python stack of every rank (py-spy dump)")
    p.add_argument("dir")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds py-spy may take per rank")
    p.add_argument("--py-spy-bytes", type=int, default=0, help="first read the controller's py-spy from stdin")
    p = sub.add_parser("sweep", help="remove a launch's containers left here (by full ID, never a shell)")
    p.add_argument("--spec", required=True, help='{"list": ARGV, "remove": ARGV}')
    p = sub.add_parser("collect", help="the tail of node.log; with --remove, then the run directory goes")
    p.add_argument("dir")
    p.add_argument("--root", required=True, help="the run root: only <root>/<run-id>/<node> is removed")
    p.add_argument("--limit", type=int, default=8 << 20, help="bytes of node.log's tail")
    p.add_argument("--remove", action="store_true", help="then remove the run directory")
    p.add_argument("--nonce", help="the launch's nonce: another launch's directory is kept")
    args = parser.parse_args(argv)
    run_dir = os.path.abspath(expand(args.dir) or ".") if getattr(args, "dir", None) else ""
    if run_dir:
        try:
            check_run_dir(run_dir)
        except UntrustedDir as exc:
            return emit({"state": None, "error": str(exc), "untrusted": True}, 2)
    if args.cmd == "start":
        return cmd_start(run_dir, args.wait, args.foreground)
    if args.cmd == "status":
        return emit(status(run_dir, args.tail, args.nonce, args.renew), 0)
    if args.cmd == "stop":
        return cmd_stop(run_dir, args.grace, args.nonce)
    if args.cmd == "collect":
        return cmd_collect(run_dir, args.root, args.limit, args.remove, args.nonce)
    if args.cmd == "sweep":
        return cmd_sweep(args.spec)
    if args.cmd == "stacks":
        try:
            from . import stacks
        except ImportError:
            import stacks  # type: ignore[no-redef]
        shipped = None
        if args.py_spy_bytes > 0:  # the controller's py-spy, after this program on stdin
            try:
                stacks.receive(run_dir, args.py_spy_bytes, sys.stdin.buffer)
            except (OSError, ValueError) as exc:
                shipped = f"cannot keep the py-spy orch brought in {run_dir}: {exc}"
        return emit(stacks.stacks(run_dir, read_json(os.path.join(run_dir, STATE)), args.timeout, shipped), 0)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
