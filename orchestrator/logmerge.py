"""Log lines: parse a node's `node.log`, merge nodes by timestamp, filter, format. Pure.

A node log line is `<UTC ISO-8601 with µs and Z> <stream> <text>` (written by the node agent, so
the time is the node's clock when the line was produced). Worker lines carry torchrun's
`--tee 3` prefix `[default<local_rank>]:` and, from the trainer, `[rank <R>] `; both are parsed
and stripped here, never guessed from the position of a line.

Fixed-width UTC timestamps sort as text, but ordering is done on epoch floats so that the clock
offsets `orch check` measured can be subtracted per node before merging.
"""

from __future__ import annotations

import calendar
import heapq
import json
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ClusterShell.NodeSet import NodeSet, NodeSetException

from .errors import UsageError

TS_LEN = 27  # len("2026-11-30T09:32:05.123456Z")
# torchrun --tee prefixes every worker line with `[<role><local_rank>]:` (role "default" unless
# --role is given); captured from torch 2.14 in tests/fixtures/torchrun_tee3_*_torch2.14.txt.
TEE_PREFIX = re.compile(r"\[([A-Za-z_][A-Za-z_-]*?)(\d+)\]:")
# The trainer's own prefix: `[rank 9] ` (agreed with the trainer engineer).
RANK_PREFIX = re.compile(r"\[rank (\d+)\] ")
# Both at once, either optional (one regex call per worker line: this is the hot path).
WORKER_PREFIX = re.compile(r"(?:\[[A-Za-z_][A-Za-z_-]*?(\d+)\]:)?(?:\[rank (\d+)\] )?")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One output line of one node, timestamped on that node."""

    ts: float
    """Epoch seconds (µs precision) on the node's clock when the line was written."""
    node: str
    node_rank: int
    rank: int | None
    """Global rank of the worker that printed it; None for torchrun's and the agent's own lines."""
    local_rank: int | None
    stream: str
    """out | err | orch (the agent's own messages)."""
    text: str


# ----------------------------------------------------------------------------- time


class _SecondCache:
    """Epoch of a `YYYY-MM-DDTHH:MM:SS` prefix; lines of one second share one conversion."""

    def __init__(self) -> None:
        self.prefix = ""
        self.epoch = 0

    def epoch_of(self, prefix: str) -> int:
        if prefix != self.prefix:
            tm = time.strptime(prefix, "%Y-%m-%dT%H:%M:%S")
            self.epoch = calendar.timegm(tm)
            self.prefix = prefix
        return self.epoch


_parse_cache = _SecondCache()


def parse_ts(stamp: str) -> float:
    """`2026-11-30T09:32:05.123456Z` → epoch seconds. Raises ValueError on anything else."""
    if len(stamp) != TS_LEN or stamp[19] != "." or stamp[26] != "Z":
        raise ValueError(f"not a UTC µs timestamp: {stamp!r}")
    return _parse_cache.epoch_of(stamp[:19]) + int(stamp[20:26]) / 1_000_000


class _FormatCache:
    def __init__(self) -> None:
        self.second = -1
        self.text = ""


_format_cache = _FormatCache()


def format_ts(ts: float) -> str:
    """Epoch seconds → `2026-11-30T09:32:05.123456Z` (exact to the µs the node wrote)."""
    us = round(ts * 1_000_000)
    sec, frac = divmod(us, 1_000_000)
    if sec != _format_cache.second:
        _format_cache.text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        _format_cache.second = sec
    return f"{_format_cache.text}.{frac:06d}Z"


# ----------------------------------------------------------------------------- parsing


def parse_node_line(raw: str, node: str, node_rank: int, base_rank: int | None,
                    fallback_ts: float | None = None) -> LogLine:
    """Parse one `node.log` line (with or without its newline).

    Global rank: the trainer's `[rank R] ` prefix when present, else `base_rank + local_rank`
    (static rendezvous: this node's workers are base_rank..base_rank+nproc-1), else None.
    A line without a valid timestamp (a torn write, a hand-edited file) gets `fallback_ts` and
    stream `out`; without a fallback it raises ValueError.
    """
    if raw.endswith("\n"):
        raw = raw[:-1]
    parts = raw.split(" ", 2)
    try:
        stamp = parts[0]
        if len(stamp) != TS_LEN or stamp[19] != "." or stamp[26] != "Z":
            raise ValueError(f"not a UTC µs timestamp: {stamp!r}")
        prefix, cache = stamp[:19], _parse_cache
        ts = (cache.epoch if prefix == cache.prefix else cache.epoch_of(prefix)) + int(stamp[20:26]) / 1_000_000
        stream = parts[1] if len(parts) > 1 else ""
        text = parts[2] if len(parts) > 2 else ""
    except ValueError:
        if fallback_ts is None:
            raise
        ts, stream, text = fallback_ts, "out", raw
    local_rank = rank = None
    if text[:1] == "[":
        m = WORKER_PREFIX.match(text)
        if m is not None and m.end():
            tee, trainer = m.groups()
            if tee is not None:
                local_rank = int(tee)
            if trainer is not None:
                rank = int(trainer)
            text = text[m.end():]
    if rank is None and local_rank is not None and base_rank is not None:
        rank = base_rank + local_rank
    return LogLine(ts, node, node_rank, rank, local_rank, stream, text)


def read_node_lines(lines: Iterable[str], node: str, node_rank: int,
                    base_rank: int | None) -> Iterator[LogLine]:
    """Parse a node's log lines in file order; an unparsable line inherits the previous time."""
    last = 0.0
    for raw in lines:
        line = parse_node_line(raw, node, node_rank, base_rank, fallback_ts=last)
        last = line.ts
        yield line


# ----------------------------------------------------------------------------- merging


def merge(streams: Iterable[Iterator[LogLine]],
          offsets_ms: Mapping[str, float] | None = None) -> Iterator[LogLine]:
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

    def __init__(self, nodes: Sequence[str], watermark: float = 1.0,
                 offsets_ms: Mapping[str, float] | None = None, *, start: float | None = None,
                 startup_grace: float = 5.0) -> None:
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
        return all(self.done[i] or i == index or self.seen[i] > key or (self.seen[i] == key and i > index)
                   for i in range(len(self.nodes)))

    def _trim(self) -> None:
        arrivals, released = self._arrivals, self._released
        while arrivals and arrivals[0][1] in released:
            released.discard(arrivals.popleft()[1])


def merge_key(line: LogLine, offsets_ms: Mapping[str, float] | None) -> float:
    """The time a line is ordered by: node time minus the node's measured clock offset."""
    return line.ts - (offsets_ms or {}).get(line.node, 0.0) / 1000.0


# ----------------------------------------------------------------------------- filters


def parse_ranks(spec: str) -> frozenset[int]:
    """`0,8-15` → {0, 8, ..., 15}. Raises UsageError on anything else."""
    ranks: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise UsageError(f"bad --rank '{spec}': '{part}' is not a rank or a range",
                             "use e.g. --rank 0 or --rank 0,8-15")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise UsageError(f"bad --rank '{spec}': range {lo}-{hi} is backwards", "write low-high, e.g. 8-15")
        ranks.update(range(lo, hi + 1))
    return frozenset(ranks)


def parse_nodes(spec: str, known: Iterable[str]) -> frozenset[str]:
    """Node names or ClusterShell ranges (`node[1-2],node4`) → the matching known node names."""
    try:
        wanted = set(NodeSet(spec))
    except NodeSetException as exc:
        raise UsageError(f"bad --node '{spec}': {exc}", "use a name or a range, e.g. gpu[01-04]") from None
    known = list(known)
    unknown = sorted(wanted - set(known))
    if unknown:
        raise UsageError(f"--node: no node named {', '.join(unknown)} in this run",
                         "nodes of this run: " + ", ".join(known))
    return frozenset(wanted)


DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(spec: str, now: float | None = None) -> float:
    """`10m`, `2h`, `1h30m`, `45s` (ago) or an ISO time → epoch seconds. A time without a zone
    is UTC, like every time orch prints."""
    spec = spec.strip()
    if re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+", spec):
        seconds = sum(float(n) * UNIT_S[u] for n, u in DURATION.findall(spec))
        return (time.time() if now is None else now) - seconds
    try:
        when = datetime.fromisoformat(spec.replace("Z", "+00:00").replace(" ", "T", 1))
    except ValueError:
        raise UsageError(f"bad --since '{spec}'",
                         "give a duration (30s, 10m, 2h, 1d) or a UTC time (2026-11-30T09:30:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


@dataclass(frozen=True)
class LineFilter:
    """What `--node/--rank/--grep/--since` keep. Empty fields keep everything."""

    nodes: frozenset[str] | None = None
    ranks: frozenset[int] | None = None
    pattern: re.Pattern[str] | None = None
    since: float | None = None
    offsets_ms: Mapping[str, float] | None = None

    def wants_node(self, node: str) -> bool:
        return self.nodes is None or node in self.nodes

    def __call__(self, line: LogLine) -> bool:
        if self.nodes is not None and line.node not in self.nodes:
            return False
        if self.ranks is not None and line.rank not in self.ranks:
            return False
        if self.since is not None and merge_key(line, self.offsets_ms) < self.since:
            return False
        return self.pattern is None or self.pattern.search(line.text) is not None

    @property
    def empty(self) -> bool:
        return self.nodes is None and self.ranks is None and self.pattern is None and self.since is None


def compile_grep(pattern: str) -> re.Pattern[str]:
    """A --grep regex, or UsageError naming what is wrong with it."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"bad --grep '{pattern}': {exc}", "it is a Python regular expression") from None


def last_n(lines: Iterable[LogLine], n: int) -> Iterator[LogLine]:
    """The last n lines of a stream (`--tail N`, per node); memory bounded by n."""
    return iter(deque(lines, maxlen=max(0, n)))


def apply(streams: Iterable[Iterator[LogLine]], keep: Callable[[LogLine], bool]) -> list[Iterator[LogLine]]:
    """Filter every stream lazily."""
    return [(line for line in s if keep(line)) for s in streams]


# ----------------------------------------------------------------------------- output

# 256-colour foregrounds that read on dark and light terminals; a node keeps its colour across
# runs because the index is a CRC of its name (Python's hash() is salted per process).
PALETTE = (33, 39, 71, 99, 135, 166, 172, 37, 63, 127, 130, 28, 165, 31, 136, 61)
DIM, RED, RESET = "\x1b[2m", "\x1b[31m", "\x1b[0m"


def node_color(node: str) -> str:
    """The ANSI colour sequence of a node (stable across runs and machines)."""
    return f"\x1b[38;5;{PALETTE[zlib.crc32(node.encode()) % len(PALETTE)]}m"


def rank_label(line: LogLine) -> str:
    """`r9` for worker lines, `-` for torchrun's and the agent's own."""
    return f"r{line.rank}" if line.rank is not None else "-"


def format_line(line: LogLine, color: bool, *, node_width: int = 0, rank_width: int = 0) -> str:
    """`TIME NODE RANK TEXT`, columns padded to the given widths; never wrapped or cut.
    With colour: the node in its own colour, the time dim, stderr text red. JSON keeps the text
    verbatim; here a line redrawn with carriage returns shows only its last state."""
    node = line.node.ljust(node_width)
    rank = rank_label(line).rjust(rank_width)
    stamp = format_ts(line.ts)
    text = line.text
    if "\r" in text:  # a progress bar redrawn in place: show what the terminal would show last
        text = text.rstrip("\r").rsplit("\r", 1)[-1]
    if not color:
        return f"{stamp} {node} {rank} {text}"
    if line.stream == "err":
        text = f"{RED}{text}{RESET}"
    elif line.stream == "orch":
        text = f"{DIM}{text}{RESET}"
    return f"{DIM}{stamp}{RESET} {node_color(line.node)}{node}{RESET} {rank} {text}"


def to_json(line: LogLine) -> str:
    """One CONTRACT.md logs object (plus `stream`)."""
    return json.dumps({"ts": format_ts(line.ts), "node": line.node, "node_rank": line.node_rank,
                       "rank": line.rank, "local_rank": line.local_rank, "line": line.text,
                       "stream": line.stream}, ensure_ascii=False)


def column_widths(nodes: Iterable[str], world_size: int | None) -> tuple[int, int]:
    """Widths of the node and rank columns for a run, so every line aligns from the start."""
    node_width = max((len(n) for n in nodes), default=0)
    rank_width = len(f"r{max(0, (world_size or 1) - 1)}")
    return node_width, rank_width
