"""Bringing a node's log to the controller: the node's reader, its frames, the local copy.

The reader (`orchestrator/node/reader.py`) runs on each node with the node's python and streams
`node.log` from a byte offset in frames (`D <n>` + n bytes, `H <state> <node time>` heartbeats
while idle, `S <json>` the node's status when it changes, if asked for, `E <state> <node time>`
when the node's state.json is final and the log is drained). The controller appends only whole
lines to its copy, `<run dir>/nodes/<node>.log`, and counts the bytes it appended, so a
reconnect resumes at exactly the next unseen line: nothing lost, nothing twice. Reading a run
needs no disk on the controller: where its disk refuses a copy (`CopyNotWritten`), what the copy
lacks is read from the node as it is shown (`node_log_from`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..config.inventory import Inventory
from ..config.plan import first_ranks
from ..errors import OrchError, TransportError
from ..node import AGENT_MODULES, FROM_STDIN, FROM_STDIN_OPEN
from ..node import program as node_program
from ..node.agent import write_all
from ..store import RunDir, recorded_nodes, remote_dir, write_private
from ..transport import Cluster, GroupResult, Process, Transport, fan_out


class ProtocolError(Exception):
    """The node's reader sent something that is not a frame (e.g. a Python traceback)."""


HELLO = b"ORCH-LOG-READER"
"""The reader's first line is this word and the session's nonce (node/reader.py's HELLO)."""
MAX_DATA = 1 << 20
"""The most bytes a D frame may announce (the reader sends at most 64 KiB)."""
MAX_HEADER = 1 << 16
"""The longest header line (an S frame's JSON is a few hundred bytes)."""
MAX_PREAMBLE = 1 << 16
"""The most the node's login shell may print before the reader's first line."""
_DATA = re.compile(rb"D ([1-9][0-9]{0,6})\n")
_BEAT = re.compile(rb"([HE]) (-|[a-z][a-z_-]{0,31}) ([0-9]{1,12}(?:\.[0-9]{1,9})?)\n")
_STATUS = re.compile(rb"S (\{[^\n]*\})\n")


def new_nonce() -> str:
    """A reader session's nonce: what the login shell prints before it cannot guess it."""
    return secrets.token_hex(12)


def read_frames(stream: IO[bytes], nonce: str) -> Iterator[tuple[str, bytes]]:
    """Frames from a reader's output: ("D", data), ("H", b"state node-time"), ("S", b"status JSON"),
    ("E", b"state node-time"). Ends at EOF.

    Whatever comes before the reader's `ORCH-LOG-READER <nonce>` line is the node's login shell
    talking (a banner, a `~/.bashrc` that echoes, `pyenv: cannot rehash`): skipped, up to
    MAX_PREAMBLE bytes; the stream ending before that line (the reader could not start: no
    python, a traceback) raises ProtocolError showing what was said. After it, every line must be
    a frame of exactly its shape and within its size, or ProtocolError."""
    hello = HELLO + b" " + nonce.encode("ascii") + b"\n"
    preamble = bytearray()
    while True:
        line = stream.readline(MAX_HEADER)
        if line == hello:
            break
        if not line:
            said = preamble.decode("utf-8", "replace").strip()[-500:]
            raise ProtocolError(said or "the log reader printed nothing before it ended")
        preamble += line
        if len(preamble) > MAX_PREAMBLE:
            raise ProtocolError(
                f"the node printed more than {MAX_PREAMBLE} bytes and no frame: "
                + preamble.decode("utf-8", "replace").strip()[-300:]
            )
    while True:
        header = stream.readline(MAX_HEADER)
        if not header:
            return
        m = _DATA.fullmatch(header)
        if m is not None and int(m.group(1)) <= MAX_DATA:
            size = int(m.group(1))
            data = stream.read(size)
            if len(data) < size:  # the connection died mid-frame: resume from the offset
                return
            yield "D", data
            continue
        m = _BEAT.fullmatch(header)
        if m is not None:
            yield m.group(1).decode(), header[2:-1]
            continue
        m = _STATUS.fullmatch(header)
        if m is not None:
            yield "S", m.group(1)
            continue
        if not header.endswith(b"\n") and len(header) < MAX_HEADER:  # the connection died mid-line
            return
        rest = stream.read(2000) if header.startswith(b"Traceback") else b""
        raise ProtocolError(
            "not a frame of the log reader: " + (header[:300] + rest).decode("utf-8", "replace").strip()[-500:]
        )


def status_frame(payload: bytes) -> dict[str, Any]:
    """The JSON object of an S frame."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can take
        data = None
    if not isinstance(data, dict):
        raise ProtocolError(f"bad status frame: {payload[:200]!r}")
    return data


# ----------------------------------------------------------------------------- per-node sources


@dataclass(frozen=True)
class NodeSource:
    """Where one node's log lives and how its lines are ranked."""

    node: str
    node_rank: int
    base_rank: int | None
    """First global rank of this node (static rendezvous); None when only the trainer knows."""
    remote_dir: str
    python: str
    copy: Path
    """The controller's copy, `<run dir>/nodes/<node>.log`."""
    nonce: str | None = None
    """The run's launch nonce: a node directory another launch claimed is read as empty."""


def node_sources(run: RunDir, inv: Inventory) -> list[NodeSource]:
    """Every node of a run in node-rank order, with ranks from run.json (else the static plan)."""
    data = run.read()
    recorded = {r.node: r for r in recorded_nodes(data)}
    nonce = run.nonce  # of orch's form, else refused (`store.check_nonce`)
    sources, firsts = [], first_ranks(inv.nodes)
    for rank, node in enumerate(inv.nodes):
        rec = recorded.get(node.name)
        node_rank = rec.node_rank if rec is not None else rank
        base_rank = (
            rec.base_rank
            if rec is not None and rec.base_rank is not None
            else firsts[node.name]
            if inv.job.rdzv == "static"
            else None
        )
        sources.append(
            NodeSource(
                node.name,
                node_rank,
                base_rank,
                remote_dir(inv, node, run.run_id),  # the snapshot's, never run.json's
                node.python,
                run.node_log(node.name),
                nonce,
            )
        )
    return sorted(sources, key=lambda s: s.node_rank)


MAX_LINE = 2 << 20
"""The longest line the controller holds whole: the node agent splits a job's lines at 1 MiB
(node/agent.py MAX_LINE), so only a node.log orch did not write has longer ones."""
LONG_LINE_MARK = b" [orch: a line longer than 2 MiB, continued on the next line]"


class LocalCopy:
    """The controller's copy of one node's log. Holds only whole lines, so its size is the byte
    offset to resume from. One process writes it at a time (flock); another process following
    the same run reads the node without writing the copy."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.fh = os.fdopen(fd, "r+b", buffering=0)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.writer = True
        except BlockingIOError:
            self.writer = False
        self.path = path
        self.offset = self._whole_lines_size()
        self.partial = bytearray()
        self.write_error: OSError | None = None
        """Why the copy stopped being written (the controller's disk full): the lines still flow
        (the live log, the watchdog), the copy just ends there; the node keeps the whole log."""
        self.held = self.offset
        """The bytes of whole lines the copy file holds: `offset` until a write fails."""

    def _whole_lines_size(self) -> int:
        """Size up to the last newline; a torn tail (a crash mid-write) is cut off when writing."""
        size = self.fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        pos = size
        while pos > 0:
            step = min(65536, pos)
            self.fh.seek(pos - step)
            chunk = self.fh.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                pos = pos - step + nl + 1
                break
            pos -= step
        if pos != size and self.writer:
            self.fh.truncate(pos)
        self.fh.seek(0, os.SEEK_END)
        return pos

    def feed(self, data: bytes) -> list[bytes]:
        """Add fetched bytes; append and return the lines they complete. Linear in what arrives:
        the unfinished line grows in place, and one longer than MAX_LINE (which the node agent,
        splitting at 1 MiB, never writes) is passed on in pieces of that size, each marked."""
        nl = data.rfind(b"\n")
        if nl < 0:
            self.partial += data
            if len(self.partial) <= MAX_LINE:
                return []
            piece, self.partial = bytes(self.partial), bytearray()
            self._append(piece)
            return [piece + LONG_LINE_MARK]
        whole = bytes(self.partial) + data[: nl + 1] if self.partial else data[: nl + 1]
        self.partial = bytearray(data[nl + 1 :])
        self._append(whole)
        return whole.split(b"\n")[:-1]

    def _append(self, data: bytes) -> None:
        if self.writer:
            try:
                self.fh.seek(0, os.SEEK_END)
                write_all(self.fh, data)
                self.held += len(data)
            except OSError as exc:
                self.writer, self.write_error = False, exc
                with contextlib.suppress(OSError):  # whole lines only, so a later reader resumes right
                    self.fh.truncate(self._whole_lines_size())
                with contextlib.suppress(OSError):
                    self.held = self._whole_lines_size()
        self.offset += len(data)

    def drop_partial(self) -> None:
        """Forget a half-received line; it is fetched again from `offset` after a reconnect."""
        self.partial = bytearray()

    def existing(self, start: int = 0) -> Iterator[bytes]:
        """The lines already in the copy from byte `start` (up to the offset when this copy was
        opened)."""
        end = self.offset
        with open(self.path, "rb") as fh:
            fh.seek(start)
            while fh.tell() < end:
                line = fh.readline()
                if not line:
                    return
                yield line

    def close(self) -> None:
        self.fh.close()


def reader_program() -> str:
    """The `python -c` text of the node's log reader, with the agent whose liveness rules it uses."""
    return node_program("reader", (*AGENT_MODULES, "agent"))


def reader_argv(
    python: str,
    remote_dir: str,
    offset: int,
    poll_s: float,
    once: bool,
    report: bool,
    nonce: str,
    launch: str | None = None,
    lease: bool = False,
) -> list[str]:
    """The command that runs the log reader (its program on stdin): node/reader.py's argv.
    `launch`: the run's launch nonce (another launch's directory reads as empty); `lease`: stdin
    stays open (FROM_STDIN_OPEN) for the lease's renewals."""
    extra = [launch or "-", "1"] if lease else [launch] if launch else []
    return [
        python,
        "-c",
        FROM_STDIN_OPEN if lease else FROM_STDIN,
        remote_dir,
        str(offset),
        f"{poll_s:g}",
        "1" if once else "0",
        "1" if report else "0",
        nonce,
        *extra,
    ]


@dataclass
class ReaderSession:
    """One run of a node's log reader: its process and the nonce its frames start after."""

    proc: Process
    nonce: str

    def frames(self) -> Iterator[tuple[str, bytes]]:
        return read_frames(self.proc.stdout, self.nonce)

    def close(self) -> None:
        self.proc.close()


def start_reader(
    transport: Transport,
    src: NodeSource,
    offset: int,
    poll_s: float,
    once: bool,
    report: bool = False,
    lease: bool = False,
) -> ReaderSession:
    """Start the node's log reader from byte `offset`, with a nonce of its own. Its program goes on
    its stdin, so for as long as it runs its command line (what `ps` shows on the node) is a few
    words, not its code. A reader that cannot start (a missing python) says why on its output,
    which the frame parser reports: a failed write here is left to it. With `lease`, stdin stays
    open after the program: each line written to it (`renew_lease`) renews the run's lease."""
    nonce = new_nonce()
    proc = transport.popen(
        reader_argv(src.python, src.remote_dir, offset, poll_s, once, report, nonce, src.nonce, lease), keep_stdin=True
    )
    program = reader_program().encode("ascii")
    with contextlib.suppress(OSError, EOFError):
        if lease:
            proc.write(b"%d\n" % len(program) + program)
        else:
            proc.write(program)
            proc.close_stdin()
    return ReaderSession(proc, nonce)


def renew_lease(proc: Process) -> None:
    """One renewal of the run's lease, through a reader started with `lease`."""
    with contextlib.suppress(OSError, EOFError, ValueError):
        proc.write(b"L\n")


class CopyNotWritten(OrchError):
    """The controller's disk refused a node's copy (`nodes/<node>.log`): the copy holds the node's
    log up to byte `held` (whole lines), and the rest stays on the node, read from there wherever
    the run's log is shown (`node_log_from`)."""

    def __init__(self, node: str, path: Path, held: int, exc: OSError) -> None:
        super().__init__(f"cannot write {path}: {exc.strerror or exc} (it holds the node's log to byte {held})")
        self.node, self.held = node, held


def fetch_node(transport: Transport, src: NodeSource, timeout: float = 120.0) -> str:
    """Bring the local copy of one node up to date (one shot); returns the node's state.
    CopyNotWritten, as soon as the controller's disk refuses the copy."""
    try:
        copy = LocalCopy(src.copy)
    except OSError as exc:  # not even opened: none of it is read
        raise CopyNotWritten(src.node, src.copy, 0, exc) from None
    reader = start_reader(transport, src, copy.offset, 0.2, once=True)
    watchdog = threading.Timer(timeout, reader.close)
    watchdog.start()
    try:
        for kind, payload in reader.frames():
            if kind == "D":
                copy.feed(payload)
                if copy.write_error is not None:
                    raise CopyNotWritten(src.node, src.copy, copy.held, copy.write_error)
            elif kind == "E":
                state, _, drained = payload.decode().partition(" ")
                if drained and copy.writer:
                    with contextlib.suppress(OSError):  # a stamp the follower skips ahead by; an older one holds
                        write_private(drained_path(src), drained)
                return state
        raise TransportError(src.node, "unreachable", "the log stream ended before the log was read to its end")
    finally:
        watchdog.cancel()
        reader.close()
        copy.close()


def node_log_from(transport: Transport, src: NodeSource, offset: int) -> Iterator[bytes]:
    """The node's log from byte `offset` to its end, in the pieces its reader sends, nothing of it
    written here: what a copy the controller's disk refused lacks (`CopyNotWritten`).
    TransportError when the stream ends before the log does."""
    reader = start_reader(transport, src, offset, 0.2, once=True)
    try:
        for kind, payload in reader.frames():
            if kind == "D":
                yield payload
            elif kind == "E":
                return
        raise TransportError(src.node, "unreachable", "the log stream ended before the log was read to its end")
    finally:
        reader.close()


def drained_path(src: NodeSource) -> Path:
    """`<copy>.drained`: the node time at which the copy last held every line the node had
    written (its reader's final drain), so lines stamped before it (less a margin) are all in."""
    return src.copy.with_name(src.copy.name + ".drained")


def drained_at(src: NodeSource) -> float | None:
    try:
        return float(drained_path(src).read_text())
    except (OSError, ValueError):
        return None


def fetch_all(
    run: RunDir, inv: Inventory, cluster: Cluster, sources: list[NodeSource] | None = None
) -> GroupResult[str]:
    """Update every node's local copy in parallel: each node's state, or why it could not be read."""
    sources = sources if sources is not None else node_sources(run, inv)
    by_name = {s.node: s for s in sources}
    nodes = [inv.node(s.node) for s in sources]
    return fan_out(nodes, lambda n: fetch_node(cluster[n.name], by_name[n.name]), inv.fanout)
