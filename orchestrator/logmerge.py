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
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any

from ClusterShell.NodeSet import NodeSet, NodeSetException

from .errors import UsageError

TS_LEN = 27  # len("2026-11-30T09:32:05.123456Z")
# The whole head of a node.log line in one match: the stamp, validated digit by digit; the stream,
# as `split(" ", 2)` takes it; then, at the start of the text, the two worker prefixes, either
# optional: torchrun's `--tee` prefix `[<role><local_rank>]:` (role "default" unless --role is
# given; captured from torch 2.14 in tests/fixtures/torchrun_tee3_*_torch2.14.txt) and the
# trainer's own `[rank 9] `. Groups: 1 the stamp's second, 2 the stream, 3 the tee's local rank,
# 4 the trainer's rank; the text starts where the match ends. ASCII digits only.
HEAD = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{6}Z"
                  r"(?:$| ([^ ]*)(?:$| (?:\[[A-Za-z_][A-Za-z_-]*?(\d+)\]:)?(?:\[rank (\d+)\] )?))", re.ASCII)


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
    stamp: str = ""
    """The node's stamp as written (a torn line: the previous line's); "" means format_ts(ts)."""


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
        t = time.gmtime(sec)  # not strftime: glibc's %Y does not pad years before 1000 to 4 digits
        _format_cache.text = f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
        _format_cache.second = sec
    return f"{_format_cache.text}.{frac:06d}Z"


# ----------------------------------------------------------------------------- parsing


def parse_node_line(raw: str, node: str, node_rank: int, base_rank: int | None,
                    fallback_ts: float | None = None, fallback_stamp: str = "") -> LogLine:
    """Parse one `node.log` line (with or without its newline).

    Global rank: the trainer's `[rank R] ` prefix when present, else `base_rank + local_rank`
    (static rendezvous: this node's workers are base_rank..base_rank+nproc-1), else None.
    A line without a valid timestamp (a torn write, a hand-edited file) gets `fallback_ts` (and
    `fallback_stamp`, the previous line's stamp) and stream `out`; without a fallback it raises
    ValueError.
    """
    if raw.endswith("\n"):
        raw = raw[:-1]
    m = HEAD.match(raw)
    epoch = None if m is None else _valid_second(m.group(1))
    if m is None or epoch is None:
        if fallback_ts is None:
            raise ValueError(f"not a node.log line (no UTC µs timestamp): {raw[:60]!r}")
        return LogLine(fallback_ts, node, node_rank, None, None, "out", raw, fallback_stamp)
    stream, tee, trainer = m.group(2, 3, 4)
    local_rank = int(tee) if tee is not None else None
    rank = global_rank(local_rank, trainer, base_rank)
    return LogLine(epoch + int(raw[20:26]) / 1_000_000, node, node_rank, rank, local_rank, stream or "",
                   raw[m.end():], raw[:TS_LEN])


SECOND = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", re.ASCII)


def global_rank(local_rank: int | None, trainer: str | None, base_rank: int | None) -> int | None:
    """A worker line's global rank: the trainer's `[rank R] ` when present, else `base_rank +
    local_rank` (static rendezvous: a node's workers are base_rank..base_rank+nproc-1), else None."""
    if trainer is not None:
        return int(trainer)
    if local_rank is not None and base_rank is not None:
        return base_rank + local_rank
    return None


def _valid_second(sec: str) -> int | None:
    """The epoch of a `YYYY-MM-DDTHH:MM:SS` (cached as the last one), None if it is no date."""
    if sec == _parse_cache.prefix:
        return _parse_cache.epoch
    if SECOND.fullmatch(sec) is None:
        return None
    try:
        return _parse_cache.epoch_of(sec)
    except ValueError:
        return None


def read_node_lines(lines: Iterable[str], node: str, node_rank: int,
                    base_rank: int | None) -> Iterator[LogLine]:
    """Parse a node's log lines in file order; an unparsable line inherits the previous time."""
    last, stamp = 0.0, ""
    for raw in lines:
        line = parse_node_line(raw, node, node_rank, base_rank, fallback_ts=last, fallback_stamp=stamp)
        last, stamp = line.ts, line.stamp
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
    return _rank_text(line.rank)


def _rank_text(rank: int | None) -> str:
    return f"r{rank}" if rank is not None else "-"


def _last_state(text: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns: its last state."""
    return text.rstrip("\r").rsplit("\r", 1)[-1]


def format_line(line: LogLine, color: bool, *, node_width: int = 0, rank_width: int = 0) -> str:
    """`TIME NODE RANK TEXT`, columns padded to the given widths; never wrapped or cut.
    With colour: the node in its own colour, the time dim, stderr text red. JSON keeps the text
    verbatim; here a line redrawn with carriage returns shows only its last state."""
    node = line.node.ljust(node_width)
    rank = rank_label(line).rjust(rank_width)
    stamp = line.stamp or format_ts(line.ts)
    text = line.text
    if "\r" in text:  # a progress bar redrawn in place: show what the terminal would show last
        text = _last_state(text)
    if not color:
        return f"{stamp} {node} {rank} {text}"
    if line.stream == "err":
        text = f"{RED}{text}{RESET}"
    elif line.stream == "orch":
        text = f"{DIM}{text}{RESET}"
    return f"{DIM}{stamp}{RESET} {node_color(line.node)}{node}{RESET} {rank} {text}"


def to_json(line: LogLine) -> str:
    """One CONTRACT.md logs object (plus `stream`)."""
    return json.dumps({"ts": line.stamp or format_ts(line.ts), "node": line.node, "node_rank": line.node_rank,
                       "rank": line.rank, "local_rank": line.local_rank, "line": line.text,
                       "stream": line.stream}, ensure_ascii=False)


def column_widths(nodes: Iterable[str], world_size: int | None) -> tuple[int, int]:
    """Widths of the node and rank columns for a run, so every line aligns from the start."""
    node_width = max((len(n) for n in nodes), default=0)
    rank_width = len(f"r{max(0, (world_size or 1) - 1)}")
    return node_width, rank_width


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
        return self.node_col + _rank_text(rank).rjust(self.rank_width) + " "

    def _mid(self, m: re.Match[str]) -> str:
        """The node and rank columns of a line whose head `m` matched (cached per head)."""
        tee, trainer = m.group(3, 4)
        mid = self._columns(global_rank(int(tee) if tee is not None else None, trainer, self.base_rank))
        # A head that ends with the trainer's `[rank R] ` cannot extend further, so a line that
        # starts with it (after a valid stamp) has exactly this head: the fast lookup's table.
        (self.closed if trainer is not None else self.open)[m.string[27:m.end()]] = mid
        return mid

    def render(self, block: str) -> list[tuple[Any, str]]:
        """Render a block of whole lines (each ending in a newline) into (key, line) pairs, the
        line without its newline."""
        lines = block.split("\n")
        lines.pop()  # the block ends with a newline: the last piece is empty
        usec = "".join(map(_USEC, lines))
        if (len(usec) == 9 * len(lines) and usec.isascii() and not usec[0::9].strip(".")
                and not usec[7::9].strip("Z") and not usec[8::9].strip(" ")
                and all(usec[k::9].isdigit() for k in range(1, 7))):
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
                epoch = self.epoch = _valid_second(last_sec)
            j = raw.find("] ", 28)
            mid = closed.get(raw[27:j + 2]) if j > 0 and epoch is not None else None
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
                append((key, f"{stamp}{mid}{_last_state(raw[j + 2:])}"))
            else:
                append((key, f"{stamp}{mid}{raw[j + 2:]}"))
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
                self.epoch = _valid_second(self.sec)
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
            text = _last_state(text)
        return key, f"{self.stamp}{mid}{text}"


_USEC = itemgetter(slice(19, 28))


def merge_plain(blocks: Sequence[Iterable[str]], nodes: Sequence[PlainNode],
                widths: tuple[int, int]) -> Iterator[str]:
    """Merge node logs into the plain `TIME NODE RANK TEXT` lines, in chunks of text.

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
        yield "\n".join(map(_TEXT, batch))


_TEXT = itemgetter(1)
