"""Merging node logs by time: a streaming k-way merge of LogLines, the live merge with its
watermark, and the plain-text block merge of whole logs. Pure.

`_fastmerge.c` beside this module is `merge_plain` in C, byte for byte (an optional build; the
stored-log paths in `stored.py` pick it when it is there).
"""

from __future__ import annotations

import heapq
import re
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from .lines import (
    HEAD,
    LogLine,
    global_rank,
    last_state,
    merge_key,
    number,
    printable,
    rank_text,
    valid_second,
)


def merge(streams: Iterable[Iterator[LogLine]], offsets_ms: Mapping[str, float] | None = None) -> Iterator[LogLine]:
    """k-way merge of per-node streams (each in file order) by node time minus that node's
    clock offset. Streaming: holds one line per stream. Ties keep the order the streams were
    given in (pass them in node-rank order), and a stream's own order is never changed, even
    where its clock stepped backwards (the key is a per-stream running maximum)."""
    offsets = {k: v / 1000.0 for k, v in (offsets_ms or {}).items() if v}
    # One flat loop over a heap of [key, index, line, stream]: this is the hot path of
    # `orch logs` on big runs, so no generator is stacked per stream.
    heap: list[list[Any]] = []
    for index, stream in enumerate(streams):
        it = iter(stream)
        for line in it:
            heap.append([line.ts - offsets.get(line.node, 0.0), index, line, it])
            break
    heapq.heapify(heap)
    replace, pop = heapq.heapreplace, heapq.heappop
    while heap:
        entry = heap[0]
        yield entry[2]
        for line in entry[3]:
            key = line.ts - offsets.get(line.node, 0.0) if offsets else line.ts
            entry[0] = key if key > entry[0] else entry[0]
            entry[2] = line
            replace(heap, entry)
            break
        else:
            pop(heap)


class LiveMerge:
    """Order lines that arrive live from several nodes, holding each back a bounded time.

    The earliest pending line is released as soon as every other live node is known to be past
    it — it sent a later line (a node's lines arrive in order), or a heartbeat saying its log
    had nothing more at a later node time — or once the oldest pending line has waited
    `watermark` seconds: a silent node then delays the others by at most the watermark.

    With `start` (the follow's start time), the watermark countdown waits until every node has
    been heard from once (connected), at most `startup_grace` s: otherwise the node that
    connects first would be printed ahead of the earlier lines of nodes still connecting.
    Pure: the caller passes the clock (`now`, monotonic seconds).
    """

    HEARTBEAT_MARGIN = 0.25
    """A heartbeat's node time is trusted minus this much: the agent stamps a line a moment
    before it reaches the file, so a line stamped just before the heartbeat may still come."""

    def __init__(
        self,
        nodes: Sequence[str],
        watermark: float = 1.0,
        offsets_ms: Mapping[str, float] | None = None,
        *,
        start: float | None = None,
        startup_grace: float = 5.0,
    ) -> None:
        self.nodes = list(nodes)
        self.watermark = watermark
        self.offsets_ms = dict(offsets_ms or {})
        self.seen = [float("-inf")] * len(self.nodes)
        self.done = [False] * len(self.nodes)
        self._heard = [False] * len(self.nodes)
        self._open_at = None if start is None else start + startup_grace
        self._heap: list[tuple[float, int, int, LogLine]] = []
        self._arrivals: deque[tuple[float, int]] = deque()  # (arrival, seq) in arrival order
        self._released: set[int] = set()
        self._seq = 0

    def push(self, index: int, line: LogLine, now: float) -> None:
        """A line from node `index` arrived at `now`."""
        # The running maximum keeps a node's own order even where its clock stepped back.
        key = max(merge_key(line, self.offsets_ms), self.seen[index])
        self.seen[index] = key
        heapq.heappush(self._heap, (key, index, self._seq, line))
        self._arrivals.append((now, self._seq))
        self._seq += 1
        self.heard(index, now)

    def heard(self, index: int, now: float, node_time: float | None = None) -> None:
        """Node `index` is connected; with `node_time`: its log had nothing more at that time."""
        if node_time is not None:
            offset = self.offsets_ms.get(self.nodes[index], 0.0) / 1000.0
            self.seen[index] = max(self.seen[index], node_time - offset - self.HEARTBEAT_MARGIN)
        if not self._heard[index]:
            self._heard[index] = True
            if self._open_at is not None and all(self._heard):
                self._open_at = min(self._open_at, now)

    def finish(self, index: int, now: float | None = None) -> None:
        """Node `index` will send nothing more (its log is drained): it no longer holds others."""
        self.done[index] = True
        self.heard(index, now if now is not None else float("-inf"))

    def _countdown(self, arrival: float) -> float:
        return arrival if self._open_at is None else max(arrival, self._open_at)

    @property
    def pending(self) -> int:
        return len(self._heap)

    @property
    def finished(self) -> bool:
        return not self._heap and all(self.done)

    def deadline(self) -> float | None:
        """When the oldest pending line will have waited the watermark (None: nothing pending)."""
        self._trim()
        return self._countdown(self._arrivals[0][0]) + self.watermark if self._arrivals else None

    def ready(self, now: float, flush: bool = False) -> Iterator[LogLine]:
        """Release, in order, every line that may go out at `now` (all of them with flush)."""
        while self._heap:
            self._trim()
            key, index = self._heap[0][0], self._heap[0][1]
            waited = now - self._countdown(self._arrivals[0][0])
            if not (flush or waited >= self.watermark or self._caught_up(index, key)):
                return
            _key, _index, seq, line = heapq.heappop(self._heap)
            self._released.add(seq)
            yield line

    def _caught_up(self, index: int, key: float) -> bool:
        # Node i's next line has a key >= seen[i]; on a tie the lower node index goes first.
        return all(
            self.done[i] or i == index or self.seen[i] > key or (self.seen[i] == key and i > index)
            for i in range(len(self.nodes))
        )

    def _trim(self) -> None:
        arrivals, released = self._arrivals, self._released
        while arrivals and arrivals[0][1] in released:
            released.discard(arrivals.popleft()[1])


# ----------------------------------------------------------------------------- plain-text merge

EPOCH_STAMP = "1970-01-01T00:00:00.000000Z"  # what a torn first line is shown at (format_ts(0.0))


@dataclass(frozen=True)
class PlainNode:
    """What the plain-text merge needs of one node: its name and how its lines are ranked."""

    node: str
    base_rank: int | None
    offset_ms: float = 0.0


class _Renderer:
    """Turns one node's raw `node.log` lines into (sort key, `TIME NODE RANK TEXT\\n`) pairs,
    exactly as `format_line(parse_node_line(...), False)` prints them, at a fraction of the cost:
    no LogLine per line, and the middle columns, which depend only on the worker prefix, are
    built once per prefix."""

    def __init__(self, node: PlainNode, node_width: int, rank_width: int, float_keys: bool) -> None:
        self.base_rank = node.base_rank
        self.float_keys = float_keys  # order by epoch floats minus the offset, else by the stamp text
        self.node_col = " " + node.node.ljust(node_width) + " "
        self.rank_width = rank_width
        self.no_rank = self._columns(None)
        self.offset = node.offset_ms / 1000.0
        self.closed: dict[str, str] = {}  # heads ending with the trainer prefix -> middle columns
        self.open: dict[str, str] = {}  # every other head seen
        self.stamp = EPOCH_STAMP
        self.key: Any = None
        self.sec = "\0"  # the last second seen (no line starts with NUL), and its epoch (None: no date)
        self.epoch: int | None = None

    def _columns(self, rank: int | None) -> str:
        """` NODE RANK `, padded as format_line pads them."""
        return self.node_col + rank_text(rank).rjust(self.rank_width) + " "

    def _mid(self, m: re.Match[str]) -> str:
        """The node and rank columns of a line whose head `m` matched (cached per head)."""
        tee, trainer = m.group(3, 4)
        mid = self._columns(global_rank(number(tee), trainer, self.base_rank))
        # A head that ends with the trainer's `[rank R] ` cannot extend further, so a line that
        # starts with it (after a valid stamp) has exactly this head: the fast lookup's table.
        (self.closed if trainer is not None else self.open)[m.string[27 : m.end()]] = mid
        return mid

    def render(self, block: str) -> list[tuple[Any, str]]:
        """Render a block of whole lines (each ending in a newline) into (key, line) pairs, the
        line without its newline."""
        lines = block.split("\n")
        lines.pop()  # the block ends with a newline: the last piece is empty
        usec = "".join(map(_USEC, lines))
        if (
            len(usec) == 9 * len(lines)
            and usec.isascii()
            and not usec[0::9].strip(".")
            and not usec[7::9].strip("Z")
            and not usec[8::9].strip(" ")
            and all(usec[k::9].isdigit() for k in range(1, 7))
        ):
            return self._render_stamped(lines)
        return self._render_any(lines)

    def _render_stamped(self, lines: list[str]) -> list[tuple[Any, str]]:
        """Lines that all have `.µµµµµµZ ` after their second (checked for the whole block at
        once): most are a second already seen plus a closed head already seen, two lookups."""
        out: list[tuple[Any, str]] = []
        append, closed, any_line = out.append, self.closed, self._any_line
        key, stamp, last_sec, epoch, offset = self.key, self.stamp, self.sec, self.epoch, self.offset
        floats = self.float_keys
        for raw in lines:
            if not raw.startswith(last_sec):  # a new second (lines of one second share it)
                last_sec = self.sec = raw[:19]
                epoch = self.epoch = valid_second(last_sec)
            j = raw.find("] ", 28)
            mid = closed.get(raw[27 : j + 2]) if j > 0 and epoch is not None else None
            if mid is None:  # anything else: the general rules, line by line
                self.key, self.stamp = key, stamp
                append(any_line(raw))
                key, stamp, last_sec, epoch = self.key, self.stamp, self.sec, self.epoch
                continue
            stamp = raw[:27]
            new = epoch + int(raw[20:26]) / 1_000_000 - offset if floats else stamp  # type: ignore[operator]
            if key is None or new > key:  # a running maximum: a node's own order never changes
                key = new
            if "\r" in raw:  # a progress bar redrawn in place: what the terminal would show last
                append((key, f"{stamp}{mid}{last_state(raw[j + 2 :])}"))
            else:
                append((key, f"{stamp}{mid}{raw[j + 2 :]}"))
        self.key, self.stamp = key, stamp
        return out

    def _render_any(self, lines: list[str]) -> list[tuple[Any, str]]:
        return [self._any_line(raw) for raw in lines]

    def _any_line(self, raw: str) -> tuple[Any, str]:
        """One line by the general rules (HEAD, the second's validity, torn lines)."""
        m = HEAD.match(raw)
        if m is not None:
            if not raw.startswith(self.sec):
                self.sec = raw[:19]
                self.epoch = valid_second(self.sec)
            if self.epoch is None:
                m = None
        key = self.key
        if m is None:  # not a node.log line (a torn write): the previous line's time, no rank
            mid, text = self.no_rank, raw
            if key is None:  # before any valid line: shown at the epoch, as parse does
                key = -self.offset if self.float_keys else self.stamp
        else:
            end = m.end()
            self.stamp = raw[:27]
            head = raw[27:end]
            mid = self.closed.get(head) or self.open.get(head) or self._mid(m)
            text = raw[end:]
            new = self.epoch + int(raw[20:26]) / 1_000_000 - self.offset if self.float_keys else self.stamp  # type: ignore[operator]
            if key is None or new > key:
                key = new
        self.key = key
        if "\r" in text:
            text = last_state(text)
        return key, f"{self.stamp}{mid}{text}"


_USEC = itemgetter(slice(19, 28))


def merge_plain(
    blocks: Sequence[Iterable[str]], nodes: Sequence[PlainNode], widths: tuple[int, int], raw: bool = False
) -> Iterator[str]:
    """Merge node logs into the plain `TIME NODE RANK TEXT` lines, in chunks of text: each line's
    text `printable` (its control characters escaped), or as written with `raw`.

    The same lines in the same order as formatting `merge()` of the parsed nodes, without a
    Python object or heap step per line: each node's input comes in blocks of whole lines; the
    blocks are rendered, and everything no node can still undercut is sorted in one go (the
    lines of each node are already in order, so the sort is a C merge of runs). Memory is one
    block per node plus one batch.

    Order: node time minus the node's offset, ties to the node given first, and a node's own
    order kept where its clock stepped back (a running maximum), as `merge`.
    """
    floats = any(n.offset_ms for n in nodes)
    renderers = [_Renderer(n, *widths, floats) for n in nodes]
    sources = [iter(b) for b in blocks]
    pending: list[list[tuple[Any, str]]] = [[] for _ in nodes]
    live = list(range(len(nodes)))
    key = itemgetter(0)
    block_lines = [1] * len(nodes)
    while True:
        # Top up every node left with less than half a block: a node holding back only a line or
        # two would otherwise set the next threshold alone, and each round would release little.
        for i in list(live):
            while len(pending[i]) < block_lines[i] // 2 + 1:
                block = next(sources[i], None)
                if block is None:
                    live.remove(i)
                    break
                rendered = renderers[i].render(block)
                block_lines[i] = len(rendered)
                pending[i] = pending[i] + rendered if pending[i] else rendered
        if not any(pending):
            return
        # Every line still to come from a live node has a key >= that node's last pending key;
        # m is the first node with the smallest such key. Nodes up to m may release lines up to
        # that key inclusive (ties go to the lower index); nodes after it only below it.
        if live:
            m = min(live, key=lambda i: pending[i][-1][0])
            threshold = pending[m][-1][0]
        batch: list[tuple[Any, str]] = []
        for i, lines in enumerate(pending):
            if not lines:
                continue
            if not live:
                cut = len(lines)
            elif i <= m:
                cut = bisect_right(lines, threshold, key=key)
            else:
                cut = bisect_left(lines, threshold, key=key)
            if cut == len(lines):
                batch += lines
                pending[i] = []
            elif cut:
                batch += lines[:cut]
                pending[i] = lines[cut:]
        batch.sort(key=key)
        batch.append((None, ""))  # a newline after the last line too
        chunk = "\n".join(map(_TEXT, batch))
        # the stamps and the node and rank columns are printable already: the chunk's unsafe
        # characters are its lines' texts' (newlines are kept)
        yield chunk if raw else printable(chunk)


_TEXT = itemgetter(1)
