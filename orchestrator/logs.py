"""`orch logs`: fetch every node's `node.log`, merge by the node's timestamps, follow live.

The pure parts (parsing, k-way merge, filters, formatting) live in `logmerge` and are
re-exported here. This module adds the side effects:

- A stdlib-only reader (`orchestrator/node/reader.py`) runs on each node with the node's python
  and streams `node.log` from a byte offset in frames (`D <n>` + n bytes, `H <state>` heartbeats
  while idle, `S <json>` the node's status when it changes, if asked for, `E <state> <node time>`
  when the node's state.json is final and the log is drained).
- The controller appends only whole lines to `<run dir>/nodes/<node>.log` and counts the bytes it
  appended, so a reconnect resumes at exactly the next unseen line: nothing lost, nothing twice.
- `Follower` runs one reader per node in a thread and releases lines in timestamp order, holding
  a line back until every other live node has caught up to it, but never longer than the
  watermark: a silent node delays the others by at most that much.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .cli import ui
from .config.inventory import Inventory
from .contract import FINAL_STATES
from .errors import TransportError, UsageError
from .logmerge import (
    LineFilter,
    LiveMerge,
    LogLine,
    PlainNode,
    apply,
    column_widths,
    compile_grep,
    format_line,
    last_n,
    merge,
    merge_key,
    merge_plain,
    parse_node_line,
    parse_nodes,
    parse_ranks,
    parse_since,
    read_node_lines,
    to_json,
)
from .node import FROM_STDIN
from .node import program as node_program
from .store import RunDir, RunStore, clock_offsets, remote_dir, write_private
from .transport import Cluster, GroupResult, Process, Transport, fan_out

__all__ = [
    "LogLine", "parse_node_line", "merge", "Follower", "format_line", "to_json", "logs_command",
    "fetch_all", "node_sources", "NodeSource",
]

CREDIT_LINES = 1000
"""Lines of one node that may wait in the live merge; a node's reader blocks beyond that, so
catching up on 32 long logs stays within a few tens of MB on the controller."""

class ProtocolError(Exception):
    """The node's reader sent something that is not a frame (e.g. a Python traceback)."""


def read_frames(stream: IO[bytes]) -> Iterator[tuple[str, bytes]]:
    """Frames from a reader's output: ("D", data), ("H", b"state node-time"), ("S", b"status JSON"),
    ("E", b"state node-time"). Ends at EOF.

    Lines before the first frame are the node's login shell talking (a `~/.bashrc` that echoes,
    `pyenv: cannot rehash` when several logins race): skipped, unless no frame ever follows or
    they are a Python traceback (the reader itself failed), which raise ProtocolError."""
    preamble: list[bytes] = []
    framed = False
    while True:
        header = stream.readline()
        if not header:
            if preamble and not framed:
                raise ProtocolError(b"".join(preamble).decode("utf-8", "replace").strip()[-500:])
            return
        kind, _, arg = header.rstrip(b"\n").partition(b" ")
        if kind == b"D" and arg.isdigit():
            size = int(arg)
            data = stream.read(size)
            if len(data) < size:  # the connection died mid-frame: resume from the offset
                return
            framed = True
            yield "D", data
        elif kind in (b"H", b"E", b"S"):
            framed = True
            yield kind.decode(), arg
        elif not framed and not kind.startswith(b"Traceback") and len(preamble) < 100:
            preamble.append(header)
        else:
            rest = stream.read(2000) if kind.startswith(b"Traceback") else b""
            raise ProtocolError((b"".join(preamble[-5:]) + header + rest).decode("utf-8", "replace").strip()[-500:])


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


def node_sources(run: RunDir, inv: Inventory) -> list[NodeSource]:
    """Every node of a run in node-rank order, with ranks from run.json (else the static plan)."""
    recorded = {n.get("node"): n for n in run.read().get("nodes") or [] if isinstance(n, dict)}
    sources, base = [], 0
    for rank, node in enumerate(inv.nodes):
        rec = recorded.get(node.name, {})
        node_rank = int(rec.get("node_rank", rank))
        base_rank: int | None = rec.get("base_rank", base if inv.job.rdzv == "static" else None)
        sources.append(NodeSource(node.name, node_rank, base_rank,
                                  str(rec.get("remote_dir") or remote_dir(inv, node, run.run_id)),
                                  node.python, run.path / "nodes" / f"{node.name}.log"))
        base += node.nproc_per_node
    return sorted(sources, key=lambda s: s.node_rank)


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
        self.partial = b""

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
        """Add fetched bytes; append and return the lines they complete."""
        buf = self.partial + data
        cut = buf.rfind(b"\n") + 1
        self.partial = buf[cut:]
        if not cut:
            return []
        whole = buf[:cut]
        if self.writer:
            self.fh.seek(0, os.SEEK_END)
            self.fh.write(whole)
        self.offset += cut
        return whole.splitlines()

    def drop_partial(self) -> None:
        """Forget a half-received line; it is fetched again from `offset` after a reconnect."""
        self.partial = b""

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
    return node_program("reader", ("agent",))


def start_reader(transport: Transport, src: NodeSource, offset: int, poll_s: float, once: bool,
                 report: bool = False) -> Process:
    """Start the node's log reader from byte `offset`. Its program goes on its stdin, so for as
    long as it runs its command line (what `ps` shows on the node) is a few words, not its code.
    A reader that cannot start (a missing python) says why on its output, which the frame
    parser reports: a failed write here is left to it."""
    proc = transport.popen([src.python, "-c", FROM_STDIN, src.remote_dir, str(offset), f"{poll_s:g}",
                            "1" if once else "0", "1" if report else "0"], keep_stdin=True)
    with contextlib.suppress(OSError, EOFError):
        proc.write(reader_program().encode("ascii"))
        proc.close_stdin()
    return proc


def fetch_node(transport: Transport, src: NodeSource, timeout: float = 120.0) -> str:
    """Bring the local copy of one node up to date (one shot); returns the node's state."""
    copy = LocalCopy(src.copy)
    proc = start_reader(transport, src, copy.offset, 0.2, once=True)
    watchdog = threading.Timer(timeout, proc.close)
    watchdog.start()
    try:
        for kind, payload in read_frames(proc.stdout):
            if kind == "D":
                copy.feed(payload)
            elif kind == "E":
                state, _, drained = payload.decode().partition(" ")
                if drained and copy.writer:
                    write_private(drained_path(src), drained)
                return state
        raise TransportError(src.node, "unreachable", "the log stream ended before the log was read to its end")
    finally:
        watchdog.cancel()
        proc.close()
        copy.close()


def drained_path(src: NodeSource) -> Path:
    """`<copy>.drained`: the node time at which the copy last held every line the node had
    written (its reader's final drain), so lines stamped before it (less a margin) are all in."""
    return src.copy.with_name(src.copy.name + ".drained")


def drained_at(src: NodeSource) -> float | None:
    try:
        return float(drained_path(src).read_text())
    except (OSError, ValueError):
        return None


def fetch_all(run: RunDir, inv: Inventory, cluster: Cluster,
              sources: list[NodeSource] | None = None) -> GroupResult[str]:
    """Update every node's local copy in parallel: each node's state, or why it could not be read."""
    sources = sources if sources is not None else node_sources(run, inv)
    by_name = {s.node: s for s in sources}
    nodes = [inv.node(s.node) for s in sources]
    return fan_out(nodes, lambda n: fetch_node(cluster[n.name], by_name[n.name]), inv.fanout)


def copy_lines(src: NodeSource) -> Iterator[LogLine]:
    """Parse a node's local copy, streaming."""
    if not src.copy.exists():
        return iter(())
    return _copy_lines(src)


def _copy_lines(src: NodeSource) -> Iterator[LogLine]:
    with open(src.copy, encoding="utf-8", errors="replace", newline="\n") as fh:
        yield from read_node_lines(fh, src.node, src.node_rank, src.base_rank)


# ----------------------------------------------------------------------------- live follow


@dataclass
class _NodeState:
    src: NodeSource
    index: int
    done: bool = False
    remote_state: str = ""
    """The node's state.json state as its reader last said ("-": none there); "" before any frame."""
    failing_since: float | None = None
    abandoned: bool = False
    last_frame: float = field(default_factory=time.monotonic)
    proc: Process | None = None
    credit: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(CREDIT_LINES))


_DONE = object()


def _status(payload: bytes) -> dict[str, Any]:
    """The JSON object of an S frame."""
    try:
        data = json.loads(payload)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ProtocolError(f"bad status frame: {payload[:200]!r}")
    return data


@dataclass(frozen=True)
class _Heartbeat:
    node_time: float


class Follower:
    """Live tail of every node of a run, released in timestamp order within a watermark.

    `lines()` ends when every node's state.json is final and its log is drained, or when `stop`
    is set (lines already fetched are still released, in order). A dropped connection is retried
    with backoff (0.5, 1, 2, 4 s) from the byte offset already appended to the local copy.
    Once the controller's run.json says the run has ended, a node that never started (no
    state.json) or that stays unreachable for `giveup_s` is given up on, with an event.

    Supervision rides on the same streams: with `on_status`, every reader also sends its node's
    status when it changes and `on_status(node, status)` gets it; `on_frame(node)` is called for
    every frame received (the stream is alive), from the node's reader thread.
    """

    def __init__(self, run: RunDir, inv: Inventory, cluster: Cluster, *, watermark: float = 1.0,
                 offsets_ms: Mapping[str, float] | None = None, from_start: bool = True,
                 on_event: Callable[[str, str], None] | None = None, poll_s: float = 0.2,
                 stall_s: float = 10.0, write_merged: bool = True, startup_grace: float = 5.0,
                 giveup_s: float = 30.0, on_status: Callable[[str, dict[str, Any]], None] | None = None,
                 on_frame: Callable[[str], None] | None = None) -> None:
        self.run, self.inv, self.cluster = run, inv, cluster
        self.watermark = watermark
        self.offsets_ms = dict(offsets_ms or {})
        self.from_start = from_start
        self.on_event = on_event or (lambda node, msg: None)
        self.poll_s, self.stall_s, self.startup_grace, self.giveup_s = poll_s, stall_s, startup_grace, giveup_s
        self.write_merged = write_merged
        self.on_status, self.on_frame = on_status, on_frame
        self.nodes = [_NodeState(src, i) for i, src in enumerate(node_sources(run, inv))]
        self.reconnects: dict[str, int] = {n.src.node: 0 for n in self.nodes}
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue()
        self._halt = threading.Event()

    # -- reader threads

    def _push(self, st: _NodeState, line: LogLine) -> None:
        while not st.credit.acquire(timeout=0.2):  # backpressure: bounded lines held per node
            if self._halt.is_set():
                return
            st.last_frame = time.monotonic()  # waiting on the merge is not a stalled connection
        self._queue.put((st.index, line))

    def _parse(self, st: _NodeState, raw: bytes, prev: LogLine | None) -> LogLine:
        """A line of the node's log; a torn one takes the time and stamp of `prev` (the line before)."""
        return parse_node_line(raw.decode("utf-8", "replace"), st.src.node, st.src.node_rank,
                               st.src.base_rank, fallback_ts=prev.ts if prev else 0.0,
                               fallback_stamp=prev.stamp if prev else "")

    def _read_node(self, st: _NodeState, copy: LocalCopy, start: int | None, prev: LogLine | None) -> None:
        """Thread body: push the local copy from byte `start` (None: none of it) through the live
        merge, then stream the node from the end of the copy until final."""
        try:
            if start is not None:
                for raw in copy.existing(start):
                    prev = line = self._parse(st, raw, prev)
                    self._push(st, line)
            self._stream(st, copy, prev)
        except Exception as exc:  # reported, and the node no longer holds the others back
            self.on_event(st.src.node, f"stopped following: {type(exc).__name__}: {exc}")
        finally:
            copy.close()
            self._queue.put((st.index, _DONE))

    def _stream(self, st: _NodeState, copy: LocalCopy, prev: LogLine | None) -> None:
        backoff = 0.5
        transport = self.cluster[st.src.node]
        while not (self._halt.is_set() or st.abandoned):
            reason = "the log stream ended"
            try:
                st.last_frame = time.monotonic()
                st.proc = start_reader(transport, st.src, copy.offset, self.poll_s, once=False,
                                       report=self.on_status is not None)
                for kind, payload in read_frames(st.proc.stdout):
                    st.last_frame = time.monotonic()
                    st.failing_since = None
                    backoff = 0.5
                    if st.abandoned:
                        return
                    if self.on_frame is not None:
                        self.on_frame(st.src.node)
                    if kind == "D":
                        for raw in copy.feed(payload):
                            prev = line = self._parse(st, raw, prev)
                            self._push(st, line)
                    elif kind == "H":
                        state, _, node_time = payload.decode().partition(" ")
                        st.remote_state = state
                        self._queue.put((st.index, _Heartbeat(float(node_time or "nan"))))
                    elif kind == "S":
                        if self.on_status is not None:
                            self.on_status(st.src.node, _status(payload))
                    else:
                        st.remote_state = payload.decode().partition(" ")[0]
                        return
            except (TransportError, ProtocolError, OSError, EOFError) as exc:
                reason = str(exc) or type(exc).__name__
            finally:
                if st.proc is not None:
                    st.proc.close()
                    st.proc = None
            if self._halt.is_set() or st.abandoned:
                return
            if st.failing_since is None:
                st.failing_since = time.monotonic()
            copy.drop_partial()
            self.reconnects[st.src.node] += 1
            self.on_event(st.src.node, f"{reason}; reconnecting in {backoff:g} s, resuming at byte {copy.offset}")
            self._halt.wait(backoff)
            backoff = min(backoff * 2, 4.0)

    def _watch(self) -> None:
        """Once a second: close a stream that sent no frame (not even a heartbeat) for stall_s —
        its connection is dead without having said so (a pulled cable) and the reader thread
        reconnects; and stop waiting for nodes that will never finish by themselves."""
        now = time.monotonic()
        run_final = self.run.read().get("state") in FINAL_STATES
        for st in self.nodes:
            proc = st.proc
            if st.done or st.abandoned:
                continue
            if run_final and st.remote_state == "-":
                self._abandon(st, "the run has ended and this node has no state.json: it never started")
            elif run_final and st.failing_since is not None and now - st.failing_since > self.giveup_s:
                self._abandon(st, f"the run has ended and the node has been unreachable for {self.giveup_s:g} s")
            elif proc is not None and now - st.last_frame > self.stall_s:
                self.on_event(st.src.node, f"no data or heartbeat for {self.stall_s:g} s: reconnecting")
                st.last_frame = now
                proc.close()
                self.cluster[st.src.node].close()

    def _abandon(self, st: _NodeState, why: str) -> None:
        self.on_event(st.src.node, f"{why}; stopped following it (lines fetched so far are kept)")
        st.abandoned = True
        proc = st.proc
        if proc is not None:
            proc.close()

    def lines(self, stop: threading.Event | None = None) -> Generator[LogLine, None, None]:
        """Every node's lines, ordered, until every node is final and drained, or `stop` is set.

        With `from_start`, what the local copies hold up to the time every node's copy is known
        complete (their `.drained` stamps, from `fetch_all`) comes first, merged in one pass: no
        thread, queue or watermark per line, so catching up on a long run is a plain k-way merge.
        The rest of each copy, then the node's live stream, go through the watermark merge."""
        stop = stop or threading.Event()
        copies = [LocalCopy(st.src.copy) for st in self.nodes]
        threads: list[threading.Thread] = []
        merged = self._open_merged()
        widths = column_widths([st.src.node for st in self.nodes], _world_size(self.run, self.inv))
        starts: list[int | None] = [0 if self.from_start else None] * len(self.nodes)
        prevs: list[LogLine | None] = [None] * len(self.nodes)
        try:
            horizon = self._horizon() if self.from_start else None
            if horizon is not None:
                yield from self._replay(copies, horizon, starts, prevs, stop, merged, widths)
                if stop.is_set():
                    return
            threads = [threading.Thread(target=self._read_node, args=(st, copy, starts[st.index], prevs[st.index]),
                                        daemon=True, name=f"orch-logs-{st.src.node}")
                       for st, copy in zip(self.nodes, copies)]
            for t in threads:
                t.start()
            yield from self._order(stop, merged, widths)
        finally:
            self._halt.set()
            for st in self.nodes:
                if st.proc is not None:
                    st.proc.close()
            for t in threads:
                t.join(timeout=5)
            if not threads:  # ended before the readers took their copies over
                for copy in copies:
                    copy.close()
            if merged is not None:
                merged.close()

    def _horizon(self) -> float | None:
        """The merge key up to which every node's copy is complete; None when a node's is unknown."""
        keys = []
        for st in self.nodes:
            drained = drained_at(st.src)
            if drained is None:
                return None
            keys.append(drained - LiveMerge.HEARTBEAT_MARGIN - self.offsets_ms.get(st.src.node, 0.0) / 1000.0)
        return min(keys, default=None)

    def _replay(self, copies: list[LocalCopy], horizon: float, starts: list[int | None], prevs: list[LogLine | None],
                stop: threading.Event, merged: IO[str] | None, widths: tuple[int, int]) -> Iterator[LogLine]:
        """The copies' lines up to `horizon`, merged; `starts`/`prevs` get where each stopped."""

        def upto(st: _NodeState, copy: LocalCopy) -> Iterator[LogLine]:
            pos, top = 0, float("-inf")
            last: LogLine | None = None
            try:
                for raw in copy.existing():
                    line = self._parse(st, raw, last)
                    top = max(top, merge_key(line, self.offsets_ms))  # a running maximum, as in merge()
                    if top > horizon:
                        break
                    pos, last = pos + len(raw), line
                    yield line
            finally:
                starts[st.index], prevs[st.index] = pos, last

        streams = [upto(st, copy) for st, copy in zip(self.nodes, copies)]
        for n, line in enumerate(merge(streams, self.offsets_ms)):
            if merged is not None:
                merged.write(format_line(line, False, node_width=widths[0], rank_width=widths[1]) + "\n")
            yield line
            if not n % 1024 and stop.is_set():
                return
        if merged is not None:
            merged.flush()

    def _order(self, stop: threading.Event, merged: IO[str] | None,
               widths: tuple[int, int]) -> Iterator[LogLine]:
        live = LiveMerge([st.src.node for st in self.nodes], self.watermark, self.offsets_ms,
                         start=time.monotonic(), startup_grace=self.startup_grace)
        index_of = {st.src.node: st.index for st in self.nodes}
        next_watch = time.monotonic() + 1.0
        while True:
            now = time.monotonic()
            for line in live.ready(now, flush=stop.is_set()):
                self.nodes[index_of[line.node]].credit.release()
                if merged is not None:
                    merged.write(format_line(line, False, node_width=widths[0], rank_width=widths[1]) + "\n")
                yield line
            if merged is not None:
                merged.flush()
            if stop.is_set() or live.finished:
                return
            if now >= next_watch:
                self._watch()
                next_watch = now + 1.0
            deadline = live.deadline()
            wait = 0.5 if deadline is None else min(0.5, deadline - now)
            try:
                index, item = self._queue.get(timeout=max(wait, 0.001))
            except queue.Empty:
                continue
            while True:
                now = time.monotonic()
                if item is _DONE:
                    self.nodes[index].done = True
                    live.finish(index, now)
                elif isinstance(item, _Heartbeat):
                    live.heard(index, now, item.node_time if item.node_time == item.node_time else None)
                else:
                    live.push(index, item, now)
                try:
                    index, item = self._queue.get_nowait()
                except queue.Empty:
                    break

    def _open_merged(self) -> IO[str] | None:
        """merged.log is rewritten from the start, or appended to when resuming, by one follower."""
        if not self.write_merged:
            return None
        fh = _lock_merged(self.run)
        if fh is not None and self.from_start:
            fh.truncate(0)
        return fh


def _lock_merged(run: RunDir) -> IO[str] | None:
    """merged.log opened for appending and locked, or None while another orch process (an
    attached `orch up`, another `orch logs -f`) is writing it: that one keeps it whole."""
    fd = os.open(run.merged_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return os.fdopen(fd, "a", encoding="utf-8")


# ----------------------------------------------------------------------------- the command


@dataclass
class _Options:
    keep: LineFilter
    tail: int | None
    as_json: bool
    color: bool
    widths: tuple[int, int]


def _world_size(run: RunDir, inv: Inventory) -> int:
    nodes = run.read().get("nodes") or []
    total = sum(int(n.get("nproc") or 0) for n in nodes if isinstance(n, dict))
    return total or sum(n.nproc_per_node for n in inv.nodes)


def _emit(lines: Iterable[LogLine], opts: _Options, out: IO[str], merged: IO[str] | None = None) -> int:
    """Print lines (and, given `merged`, write them to the merged log as plain text in the
    same pass); returns how many."""
    count = 0
    widths = opts.widths
    for line in lines:
        plain = format_line(line, False, node_width=widths[0], rank_width=widths[1])
        if merged is not None:
            merged.write(plain + "\n")
        if opts.as_json:
            out.write(to_json(line) + "\n")
        elif opts.color:
            out.write(format_line(line, True, node_width=widths[0], rank_width=widths[1]) + "\n")
        else:
            out.write(plain + "\n")
        count += 1
    out.flush()
    return count


@contextlib.contextmanager
def _merged_log(run: RunDir) -> Iterator[IO[str] | None]:
    """`<run dir>/merged.log`, rewritten atomically (private) once the writing completes; None
    (left alone) while a follower in another process is appending to it."""
    held = _lock_merged(run)
    if held is None:
        yield None
        return
    tmp = run.merged_log.with_name(f".merged.log.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            os.chmod(tmp, 0o600)
            yield fh
        os.replace(tmp, run.merged_log)
    finally:
        held.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_merged_log(run: RunDir, sources: list[NodeSource], offsets_ms: Mapping[str, float],
                     widths: tuple[int, int]) -> None:
    """`<run dir>/merged.log`: every node's copy, merged, as plain text."""
    with _merged_log(run) as fh:
        if fh is None:
            return
        raw = _binary(fh)
        for chunk in plain_merged_bytes(sources, offsets_ms, widths):
            _write_chunk(chunk, fh, raw)


BLOCK_BYTES = 4 << 20
"""Bytes of node logs the plain merge reads at once, split between the nodes (at least 32 KiB
each). Rendered lines, keys and the batch take a few times that in memory."""


def block_size(nodes: int) -> int:
    """Bytes each node's copy is read in by the plain merges (Python and C): BLOCK_BYTES split."""
    return max(32 << 10, BLOCK_BYTES // max(1, nodes))


def copy_blocks(src: NodeSource, size: int) -> Iterator[str]:
    """A node's local copy in blocks of whole lines (about `size` bytes each), decoded as
    `copy_lines` decodes it; a torn last line gets its newline."""
    try:
        fh = open(src.copy, "rb")  # noqa: SIM115 - closed below, also when abandoned early
    except FileNotFoundError:
        return
    with fh:
        rest = b""
        while True:
            chunk = fh.read(size)
            if not chunk:
                if rest:
                    yield (rest + b"\n").decode("utf-8", "replace")
                return
            buf = rest + chunk if rest else chunk
            cut = buf.rfind(b"\n") + 1
            rest = buf[cut:]
            if cut:
                yield buf[:cut].decode("utf-8", "replace")


def plain_merged(sources: list[NodeSource], offsets_ms: Mapping[str, float],
                  widths: tuple[int, int]) -> Iterator[str]:
    """Every node's copy, merged, as chunks of plain `TIME NODE RANK TEXT` lines (the fast path
    for what `format_line(merge(...))` prints when nothing is filtered)."""
    size = block_size(len(sources))
    return merge_plain([copy_blocks(s, size) for s in sources],
                       [PlainNode(s.node, s.base_rank, offsets_ms.get(s.node, 0.0)) for s in sources], widths)


try:  # the C merge, when the install could build it (setup.py); else the Python one, same bytes
    from . import _fastmerge
except ImportError:  # pragma: no cover - a machine without a C compiler
    _fastmerge = None  # type: ignore[assignment, unused-ignore]


def fast_merge_available() -> bool:
    """Whether `plain_merged_bytes` runs the C merge (ORCH_PURE_PYTHON=1 turns it off)."""
    return _fastmerge is not None and not os.environ.get("ORCH_PURE_PYTHON")


def plain_merged_bytes(sources: list[NodeSource], offsets_ms: Mapping[str, float],
                       widths: tuple[int, int]) -> Iterator[bytes]:
    """`plain_merged` as UTF-8 chunks of whole lines: the same bytes, by the C merge when it is
    built (several times faster; the same block of memory per node), else the Python one."""
    if not fast_merge_available():
        for text in plain_merged(sources, offsets_ms, widths):
            yield text.encode("utf-8")
        return
    with contextlib.ExitStack() as stack:
        present, handles = [], []
        for s in sources:
            try:
                handles.append(stack.enter_context(open(s.copy, "rb")))
            except FileNotFoundError:  # never fetched: no lines, as copy_blocks
                continue
            present.append(s)
        yield from _fastmerge.PlainMerge(
            handles, [f" {s.node.ljust(widths[0])} ".encode() for s in present],
            [s.base_rank for s in present], [offsets_ms.get(s.node, 0.0) for s in present], widths[1],
            float_keys=any(offsets_ms.get(s.node, 0.0) for s in sources), block=block_size(len(sources)))


def _binary(out: IO[str]) -> IO[bytes] | None:
    """The byte stream under a UTF-8 text stream (flushed), to write merged bytes to as they
    are; None when there is none (a test's StringIO) or it encodes otherwise."""
    raw = getattr(out, "buffer", None)
    if raw is None or (getattr(out, "encoding", None) or "").lower().replace("-", "") != "utf8":
        return None
    out.flush()
    return raw


def _write_chunk(chunk: bytes, out: IO[str], raw: IO[bytes] | None) -> None:
    if raw is not None:
        raw.write(chunk)
    else:
        out.write(chunk.decode("utf-8"))


def _say_skew(console: Any, offsets: Mapping[str, float], origin: str | None) -> None:
    shown = ", ".join(f"{n} {v:+.1f} ms" for n, v in sorted(offsets.items()))
    console.print(f"orch: ordering lines by node time minus the clock offsets measured by orch check "
                  f"({origin}): {shown}; printed times are each node's own clock. "
                  "--no-skew-correct to turn off", markup=False)


def logs_command(run: str | None, *, follow: bool, node: str | None, rank: str | None, grep: str | None,
                 since: str | None, tail: int | None, as_json: bool, skew_correct: bool | None,
                 watermark: float) -> int:
    """`orch logs`: fetch, merge, filter and print a run's logs; with follow, keep tailing."""
    rundir = RunStore().get(run)
    inv = rundir.inventory()
    console = ui.console()
    sources = node_sources(rundir, inv)
    offsets, origin = clock_offsets(rundir, inv.name)
    if skew_correct is False or not any(offsets.values()):
        offsets = {}
    elif offsets:
        _say_skew(console, offsets, origin)
    keep = LineFilter(
        nodes=parse_nodes(node, [s.node for s in sources]) if node else None,
        ranks=parse_ranks(rank) if rank else None,
        pattern=compile_grep(grep) if grep else None,
        since=parse_since(since) if since else None,
        offsets_ms=offsets,
    )
    if tail is not None and tail < 0:
        raise UsageError(f"--tail {tail}: must be 0 or more", "e.g. --tail 50: the last 50 lines of each node")
    widths = column_widths([s.node for s in sources], _world_size(rundir, inv))
    opts = _Options(keep, tail, as_json, ui.color_enabled(sys.stdout) and not as_json, widths)
    try:
        with Cluster(inv) as cluster:
            _fetch_and_warn(rundir, inv, cluster, sources, console)
            if not follow or tail is not None:
                _print_stored(rundir, sources, offsets, opts)
            if follow:
                with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends a follow; exit code 0
                    _follow(rundir, inv, cluster, offsets, watermark, opts, console, from_start=tail is None)
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
    return 0


def _fetch_and_warn(run: RunDir, inv: Inventory, cluster: Cluster, sources: list[NodeSource],
                    console: Any) -> None:
    for name, exc in fetch_all(run, inv, cluster, sources).failed.items():
        console.print(f"orch: {name}: cannot fetch its log ({exc}); showing the copy fetched "
                      "earlier", markup=False, style="yellow")


def _print_stored(run: RunDir, sources: list[NodeSource], offsets: Mapping[str, float], opts: _Options) -> None:
    """Print the fetched copies merged and filtered; refresh merged.log (in the same pass when
    nothing is filtered out, else in a second one)."""
    everything = opts.keep.empty and opts.tail is None
    if everything and not opts.as_json and not opts.color:
        # plain text, all of it: stdout gets exactly merged.log's text, merged in blocks
        out = sys.stdout
        with _merged_log(run) as merged:
            out_raw = _binary(out)
            merged_raw = _binary(merged) if merged is not None else None
            for chunk in plain_merged_bytes(sources, offsets, opts.widths):
                _write_chunk(chunk, out, out_raw)
                if merged is not None:
                    _write_chunk(chunk, merged, merged_raw)
        (out_raw or out).flush()
        return
    streams: list[Iterator[LogLine]] = [copy_lines(s) for s in sources if opts.keep.wants_node(s.node)]
    if not opts.keep.empty:
        streams = apply(streams, opts.keep)
    if opts.tail is not None:
        streams = [last_n(s, opts.tail) for s in streams]
    if everything:
        with _merged_log(run) as merged:
            _emit(merge(streams, offsets), opts, sys.stdout, merged)
        return
    _emit(merge(streams, offsets), opts, sys.stdout)
    write_merged_log(run, sources, offsets, opts.widths)


def _follow(run: RunDir, inv: Inventory, cluster: Cluster, offsets: Mapping[str, float], watermark: float,
            opts: _Options, console: Any, from_start: bool) -> None:
    def event(node: str, msg: str) -> None:
        console.print(f"orch: {node}: {msg}", markup=False, style="yellow")

    follower = Follower(run, inv, cluster, watermark=watermark, offsets_ms=offsets, from_start=from_start,
                        on_event=event)
    stream = follower.lines()
    out = sys.stdout
    try:
        for line in stream:
            if not opts.keep(line):
                continue
            if opts.as_json:
                out.write(to_json(line) + "\n")
            else:
                out.write(format_line(line, opts.color, node_width=opts.widths[0], rank_width=opts.widths[1]) + "\n")
            out.flush()
    finally:
        stream.close()  # on Ctrl-C too: stops the readers on every node now, not at garbage collection
    state = run.read().get("state", "unknown")
    console.print(f"orch: every node's log is drained (run {run.run_id}: {state})", markup=False)

