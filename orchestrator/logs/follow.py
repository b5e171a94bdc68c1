"""Following a run live: one stream per node, merged in timestamp order within a watermark.

A `NodeStream` runs one node's reader in a thread: it pushes the node's lines in file order,
reconnects with backoff from the byte offset its local copy holds, and passes on the node's
status frames. The `Follower` starts one per node and releases their lines in timestamp order
(`merge.LiveMerge`), holding a line back until every other live node has caught up to it, but
never longer than the watermark: a silent node delays the others by at most that much.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from ..config.inventory import Inventory
from ..contract import FINAL_STATES
from ..errors import TransportError
from ..store import RunDir
from ..transport import Cluster, Transport
from .fetch import (
    LocalCopy,
    NodeSource,
    ProtocolError,
    ReaderSession,
    drained_at,
    node_sources,
    renew_lease,
    start_reader,
    status_frame,
)
from .lines import LogLine, column_widths, format_line, merge_key, parse_node_line
from .merge import LiveMerge, merge
from .stored import (
    ControllerTail,
    append_controller_line,
    controller_line,
    controller_name,
    lock_merged,
    world_size,
)

LEASE_RENEW_S = 1.0
"""How often an attached `orch up` renews each node's lease (on a frame from its reader).

A frame comes at least every 0.2 s; a renewal is one line written back to the reader."""
CREDIT_LINES = 1000
"""Lines of one node that may wait in the live merge; a node's reader blocks beyond that, so
catching up on 32 long logs stays within a few tens of MB on the controller."""

_DONE = object()


@dataclass(frozen=True)
class _Heartbeat:
    node_time: float


class NodeStream:
    """One node's log, live: a thread that streams the node's reader into the Follower's queue.

    It first pushes what its local copy holds from a byte offset (if asked), then streams the
    node from the end of the copy until the node's state is final and its log drained. A dropped
    connection is retried with backoff (0.5, 1, 2, 4 s) from the offset the copy reached. With
    `on_status`, its reader also sends the node's status when it changes; `on_frame(node)` hears
    every frame (the stream is alive). Both are called from this stream's thread.
    """

    def __init__(
        self,
        src: NodeSource,
        index: int,
        transport: Transport,
        out: queue.Queue[tuple[int, Any]],
        halt: threading.Event,
        *,
        poll_s: float,
        on_event: Callable[[str, str], None],
        on_status: Callable[[str, dict[str, Any]], None] | None = None,
        on_frame: Callable[[str], None] | None = None,
        lease: bool = False,
    ) -> None:
        self.src, self.index, self.transport = src, index, transport
        self.lease = lease
        """Renew the run's lease on the node through the reader (an attached `orch up`)."""
        self.renewed = 0.0
        self.out, self.halt = out, halt
        self.poll_s = poll_s
        self.on_event, self.on_status, self.on_frame = on_event, on_status, on_frame
        self.done = False
        self.remote_state = ""
        """The node's state.json state as its reader last said ("-": none there); "" before any frame."""
        self.failing_since: float | None = None
        self.abandoned = False
        self.last_frame = time.monotonic()
        self.reader: ReaderSession | None = None
        self.credit = threading.Semaphore(CREDIT_LINES)
        self.reconnects = 0
        self.thread: threading.Thread | None = None

    def start(self, copy: LocalCopy, start: int | None, prev: LogLine | None) -> threading.Thread:
        """Run in a thread: the copy from byte `start` (None: none of it), then the live stream."""
        thread = threading.Thread(
            target=self._run, args=(copy, start, prev), daemon=True, name=f"orch-logs-{self.src.node}"
        )
        thread.start()
        self.thread = thread  # only once started: a Ctrl-C before that leaves nothing to join
        return thread

    def parse(self, raw: bytes, prev: LogLine | None) -> LogLine:
        """A line of the node's log; a torn one takes the time and stamp of `prev` (the line before)."""
        return parse_node_line(
            raw.decode("utf-8", "replace"),
            self.src.node,
            self.src.node_rank,
            self.src.base_rank,
            fallback_ts=prev.ts if prev else 0.0,
            fallback_stamp=prev.stamp if prev else "",
        )

    def abandon(self, why: str) -> None:
        """Stop following this node (lines fetched so far are kept)."""
        self.on_event(self.src.node, f"{why}; stopped following it (lines fetched so far are kept)")
        self.abandoned = True
        self.close()

    def restart_if_stalled(self, now: float, stall_s: float) -> None:
        """Close a stream that sent no frame (not even a heartbeat) for `stall_s`: its connection is
        dead without having said so (a pulled cable), and the thread reconnects."""
        reader = self.reader
        if reader is not None and now - self.last_frame > stall_s:
            self.on_event(self.src.node, f"no data or heartbeat for {stall_s:g} s: reconnecting")
            self.last_frame = now
            reader.close()
            self.transport.close()

    def close(self) -> None:
        reader = self.reader
        if reader is not None:
            reader.close()

    def _push(self, line: LogLine) -> None:
        while not self.credit.acquire(timeout=0.2):  # backpressure: bounded lines held per node
            if self.halt.is_set():
                return
            self.last_frame = time.monotonic()  # waiting on the merge is not a stalled connection
        self.out.put((self.index, line))

    def _run(self, copy: LocalCopy, start: int | None, prev: LogLine | None) -> None:
        try:
            if start is not None:
                for raw in copy.existing(start):
                    prev = line = self.parse(raw, prev)
                    self._push(line)
            self._stream(copy, prev)
        except Exception as exc:  # reported, and the node no longer holds the others back
            self.on_event(self.src.node, f"stopped following: {type(exc).__name__}: {exc}")
        finally:
            copy.close()
            self.out.put((self.index, _DONE))

    def _stream(self, copy: LocalCopy, prev: LogLine | None) -> None:
        backoff = 0.5
        while not (self.halt.is_set() or self.abandoned):
            reason = "the log stream ended"
            try:
                self.last_frame = time.monotonic()
                self.reader = start_reader(
                    self.transport,
                    self.src,
                    copy.offset,
                    self.poll_s,
                    once=False,
                    report=self.on_status is not None,
                    lease=self.lease,
                )
                for kind, payload in self.reader.frames():
                    self.last_frame = time.monotonic()
                    if self.lease and self.last_frame - self.renewed >= LEASE_RENEW_S:
                        self.renewed = self.last_frame
                        renew_lease(self.reader.proc)
                    self.failing_since = None
                    backoff = 0.5
                    if self.abandoned:
                        return
                    if self.on_frame is not None:
                        self.on_frame(self.src.node)
                    if kind == "D":
                        failed = copy.write_error
                        for raw in copy.feed(payload):
                            prev = line = self.parse(raw, prev)
                            self._push(line)
                        if copy.write_error is not None and failed is None:
                            self.on_event(
                                self.src.node,
                                f"cannot write {copy.path}: "
                                f"{copy.write_error.strerror or copy.write_error}; the log goes on "
                                "without its local copy (the node keeps the whole log)",
                            )
                    elif kind == "H":  # `state time`, both checked by read_frames
                        state, _, node_time = payload.decode("ascii").partition(" ")
                        self.remote_state = state
                        self.out.put((self.index, _Heartbeat(float(node_time))))
                    elif kind == "S":
                        if self.on_status is not None:
                            self.on_status(self.src.node, status_frame(payload))
                    else:
                        self.remote_state = payload.decode("ascii").partition(" ")[0]
                        return
            except (TransportError, ProtocolError, OSError, EOFError, ValueError) as exc:
                # whatever the node sent, the stream reconnects: a node is never dropped from the log,
                # unless its allocation has ended (srun's words): nothing can be read there any more
                reason = str(exc) or type(exc).__name__
                ended = exc if isinstance(exc, TransportError) else self.transport.unreached(1, reason)
                if ended is not None and ended.kind == "gone":
                    text = ended.message.removeprefix(f"{self.src.node}: ")
                    self.on_event(self.src.node, f"{text}: its log is followed no further")
                    return
            finally:
                if self.reader is not None:
                    self.reader.close()
                    self.reader = None
            if self.halt.is_set() or self.abandoned:
                return
            if self.failing_since is None:
                self.failing_since = time.monotonic()
            copy.drop_partial()
            self.reconnects += 1
            self.on_event(self.src.node, f"{reason}; reconnecting in {backoff:g} s, resuming at byte {copy.offset}")
            self.halt.wait(backoff)
            backoff = min(backoff * 2, 4.0)


class Follower:
    """Live tail of every node of a run, released in timestamp order within a watermark.

    `lines()` ends when every node's state.json is final and its log is drained, or when `stop`
    is set (lines already fetched are still released, in order). Once the controller's run.json
    says the run has ended, a node that never started (no state.json) or that stays unreachable
    for `giveup_s` is given up on, with an event. Each node is a `NodeStream`; `on_status` and
    `on_frame` are passed to every one of them (supervision rides on the same streams).
    """

    def __init__(
        self,
        run: RunDir,
        inv: Inventory,
        cluster: Cluster,
        *,
        watermark: float = 1.0,
        offsets_ms: Mapping[str, float] | None = None,
        from_start: bool = True,
        on_event: Callable[[str, str], None] | None = None,
        poll_s: float = 0.2,
        stall_s: float = 10.0,
        write_merged: bool = True,
        startup_grace: float = 5.0,
        giveup_s: float = 30.0,
        on_status: Callable[[str, dict[str, Any]], None] | None = None,
        on_frame: Callable[[str], None] | None = None,
        lease: bool = False,
    ) -> None:
        self.run, self.inv, self.cluster = run, inv, cluster
        self.watermark = watermark
        self.offsets_ms = dict(offsets_ms or {})
        self.from_start = from_start
        self.stall_s, self.startup_grace, self.giveup_s = stall_s, startup_grace, giveup_s
        self.write_merged = write_merged
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue()
        self._halt = threading.Event()
        events = on_event or (lambda node, msg: None)
        self.on_event = events
        sources = node_sources(run, inv)
        self.nodes = [
            NodeStream(
                src,
                i,
                cluster[src.node],
                self._queue,
                self._halt,
                poll_s=poll_s,
                on_event=events,
                on_status=on_status,
                on_frame=on_frame,
                lease=lease,
            )
            for i, src in enumerate(sources)
        ]
        self.controller = controller_name(src.node for src in sources)
        """The node column of the controller's own lines (controller.log), merged after the nodes."""
        self._said: list[LogLine] = []
        self._stored: list[LogLine] = []
        """controller.log's lines still to merge, in file order."""
        self._tail = ControllerTail(run, self.controller)
        """controller.log as it grows: another shell's `orch up` may add to it while this follows."""

    @property
    def reconnects(self) -> dict[str, int]:
        """How often each node's stream reconnected."""
        return {st.src.node: st.reconnects for st in self.nodes}

    def _watch(self) -> None:
        """Once a second: restart streams that stalled, and stop waiting for nodes that will never
        finish by themselves."""
        now = time.monotonic()
        run_final = self.run.read().get("state") in FINAL_STATES
        for st in self.nodes:
            if st.done or st.abandoned:
                continue
            if run_final and st.remote_state == "-":
                st.abandon("the run has ended and this node has no state.json: it never started")
            elif run_final and st.failing_since is not None and now - st.failing_since > self.giveup_s:
                st.abandon(f"the run has ended and the node has been unreachable for {self.giveup_s:g} s")
            else:
                st.restart_if_stalled(now, self.stall_s)

    def lines(self, stop: threading.Event | None = None) -> Generator[LogLine, None, None]:
        """Every node's lines, ordered, until every node is final and drained, or `stop` is set.

        With `from_start`, what the local copies hold up to the time every node's copy is known
        complete (their `.drained` stamps, from `fetch_all`) comes first, merged in one pass: no
        thread, queue or watermark per line, so catching up on a long run is a plain k-way merge.
        The rest of each copy, then the node's live stream, go through the watermark merge."""
        stop = stop or threading.Event()
        copies = [LocalCopy(st.src.copy) for st in self.nodes]
        started = False
        merged = self._open_merged()
        names = [st.src.node for st in self.nodes]
        if self.from_start:  # what controller.log holds (a relaunch appends to merged.log: it is there already)
            self._stored = self._tail.read()
            names += [self.controller] if self.run.controller_log.exists() else []
        else:
            self._tail.read()  # what it holds already is in merged.log; read on from its end
        widths = column_widths(names, world_size(self.run, self.inv))
        starts: list[int | None] = [0 if self.from_start else None] * len(self.nodes)
        prevs: list[LogLine | None] = [None] * len(self.nodes)
        try:
            horizon = self._horizon() if self.from_start else None
            if horizon is not None:
                yield from self._replay(copies, horizon, starts, prevs, stop, merged, widths)
                if stop.is_set():
                    return
            for st, copy in zip(self.nodes, copies):
                st.start(copy, starts[st.index], prevs[st.index])
            started = True
            yield from self._order(stop, merged, widths)
        finally:
            self._halt.set()
            for st in self.nodes:
                st.close()
            for st in self.nodes:
                if st.thread is not None:
                    st.thread.join(timeout=5)
            if not started:  # ended before the streams took their copies over
                for copy in copies:
                    copy.close()
            if merged is not None:
                with contextlib.suppress(OSError, ValueError):  # a full disk: warned about as it was written
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

    def _replay(
        self,
        copies: list[LocalCopy],
        horizon: float,
        starts: list[int | None],
        prevs: list[LogLine | None],
        stop: threading.Event,
        merged: IO[str] | None,
        widths: tuple[int, int],
    ) -> Iterator[LogLine]:
        """The copies' lines up to `horizon`, merged; `starts`/`prevs` get where each stopped."""

        def upto(st: NodeStream, copy: LocalCopy) -> Iterator[LogLine]:
            pos, top = 0, float("-inf")
            last: LogLine | None = None
            try:
                for raw in copy.existing():
                    line = st.parse(raw, last)
                    top = max(top, merge_key(line, self.offsets_ms))  # a running maximum, as in merge()
                    if top > horizon:
                        break
                    pos, last = pos + len(raw), line
                    yield line
            finally:
                starts[st.index], prevs[st.index] = pos, last

        upto_horizon = [line for line in self._stored if merge_key(line, self.offsets_ms) <= horizon]
        self._stored = self._stored[len(upto_horizon) :]
        streams = [upto(st, copy) for st, copy in zip(self.nodes, copies)] + [iter(upto_horizon)]
        for n, line in enumerate(merge(streams, self.offsets_ms)):
            if merged is not None:
                merged = self._write_merged(
                    merged, format_line(line, False, node_width=widths[0], rank_width=widths[1]) + "\n"
                )
            yield line
            for said in self._take_said():  # said on seeing `line`: right after it, as the merge is ordered here
                if merged is not None:
                    merged = self._write_merged(
                        merged, format_line(said, False, node_width=widths[0], rank_width=widths[1]) + "\n"
                    )
                yield said
            if not n % 1024 and stop.is_set():
                return
        if merged is not None:
            self._write_merged(merged, "")

    def _order(self, stop: threading.Event, merged: IO[str] | None, widths: tuple[int, int]) -> Iterator[LogLine]:
        live = LiveMerge(
            [st.src.node for st in self.nodes] + [self.controller],
            self.watermark,
            self.offsets_ms,
            start=time.monotonic(),
            startup_grace=self.startup_grace,
        )
        ctl = len(self.nodes)
        live.finish(ctl)  # the controller's lines are pushed as they are known: they hold no node back
        index_of = {st.src.node: st.index for st in self.nodes}
        next_watch = time.monotonic() + 1.0
        while True:
            now = time.monotonic()
            self._push_stored(live, ctl, now)
            for line in live.ready(now, flush=stop.is_set()):
                if line.node in index_of:
                    self.nodes[index_of[line.node]].credit.release()
                if merged is not None:
                    merged = self._write_merged(
                        merged, format_line(line, False, node_width=widths[0], rank_width=widths[1]) + "\n"
                    )
                yield line
                for said in self._take_said():  # in order with the lines still held: through the merge
                    live.push(ctl, said, time.monotonic())
            if merged is not None:
                merged = self._write_merged(merged, "")
            if stop.is_set() or live.finished:
                return
            if now >= next_watch:
                self._watch()
                self._stored.extend(self._tail.read())
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

    def say(self, ts: float, text: str) -> None:
        """A line of the controller's own (`orch up` naming a straggler) at `ts` on the reference
        clock: appended to controller.log, where `orch logs` merges it from, and merged into this
        follow's lines (and merged.log) in order. Call it from the thread consuming `lines()`."""
        raw = controller_line(ts, text)
        try:
            append_controller_line(self.run, ts, text)
            self._tail.wrote(raw)
        except OSError as exc:
            self.on_event("controller", f"cannot write {self.run.controller_log}: {exc.strerror or exc}")
        self._said.append(parse_node_line(raw, self.controller, -1, None))

    def _take_said(self) -> list[LogLine]:
        said, self._said = self._said, []
        return said

    def _push_stored(self, live: LiveMerge, ctl: int, now: float) -> None:
        """Move controller.log's lines into the merge once every live node is past them (or done)."""
        while self._stored:
            key = merge_key(self._stored[0], self.offsets_ms)
            if not all(live.done[i] or live.seen[i] >= key for i in range(ctl)):
                return
            live.push(ctl, self._stored.pop(0), now)

    def _write_merged(self, merged: IO[str], text: str) -> IO[str] | None:
        """Append to merged.log (flush with no text); a write the disk refuses ends merged.log
        there, with a warning, and the merge goes on (None: write no more)."""
        try:
            if text:
                merged.write(text)
            else:
                merged.flush()
            return merged
        except (OSError, ValueError) as exc:  # ValueError: closed after an earlier refusal
            if merged.closed:
                return None
            self.on_event(
                "controller",
                f"cannot write {self.run.merged_log}: {getattr(exc, 'strerror', None) or exc}; the merged "
                "log goes on without it (`orch logs` merges the nodes' logs again later)",
            )
            with contextlib.suppress(OSError):
                merged.close()
            return None

    def _open_merged(self) -> IO[str] | None:
        """merged.log is rewritten from the start, or appended to when resuming, by one follower."""
        if not self.write_merged:
            return None
        fh = lock_merged(self.run)
        if fh is not None and self.from_start:
            fh.truncate(0)
        return fh
