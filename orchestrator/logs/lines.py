"""A node log line: parse it, stamp its time, format it. Pure.

A node log line is `<UTC ISO-8601 with µs and Z> <stream> <text>` (written by the node agent, so
the time is the node's clock when the line was produced). A worker's text starts with its field
`[<role><local_rank>]:` (`node/agent.py` `WORKER_FIELD`: torchrun's `--tee` prefix, which the agent
writes) and, from the trainer, `[rank <R>] ` (`trainer.py` defines what orch reads of the trainer's
output); both are parsed and stripped here, never guessed from the position of a line.

Fixed-width UTC timestamps sort as text, but ordering is done on epoch floats so that the clock
offsets `orch check` measured can be subtracted per node before merging (`merge_key`).
"""

from __future__ import annotations

import calendar
import json
import re
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from ..node.agent import WORKER_FIELD
from .trainer import RANK_PREFIX

TS_LEN = 27  # len("2026-11-30T09:32:05.123456Z")
# The whole head of a node.log line in one match: the stamp, validated digit by digit; the stream,
# as `split(" ", 2)` takes it; then, at the start of the text, the two worker prefixes, either
# optional: the agent's worker field `[<role><local_rank>]:` (torchrun's `--tee` prefix, role
# "default" unless --role is given; captured from torch 2.14 in tests/fixtures/torchrun_tee3_*_torch2.14.txt)
# and the trainer's own `[rank 9] `. Groups: 1 the stamp's second, 2 the stream, 3 the local rank,
# 4 the trainer's rank; the text starts where the match ends. ASCII digits only.
HEAD = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{6}Z"
    r"(?:$| ([^ ]*)(?:$| (?:" + WORKER_FIELD + r")?(?:" + RANK_PREFIX + r")?))",
    re.ASCII,
)


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
        _format_cache.text = (
            f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
        )
        _format_cache.second = sec
    return f"{_format_cache.text}.{frac:06d}Z"


# ----------------------------------------------------------------------------- parsing


def parse_node_line(
    raw: str,
    node: str,
    node_rank: int,
    base_rank: int | None,
    fallback_ts: float | None = None,
    fallback_stamp: str = "",
) -> LogLine:
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
    epoch = None if m is None else valid_second(m.group(1))
    if m is None or epoch is None:
        if fallback_ts is None:
            raise ValueError(f"not a node.log line (no UTC µs timestamp): {raw[:60]!r}")
        return LogLine(fallback_ts, node, node_rank, None, None, "out", raw, fallback_stamp)
    stream, tee, trainer = m.group(2, 3, 4)
    try:  # `number(tee)`, inline: every line comes here
        local_rank = int(tee) if tee is not None else None
    except ValueError:
        local_rank = None
    rank = global_rank(local_rank, trainer, base_rank)
    return LogLine(
        epoch + int(raw[20:26]) / 1_000_000,
        node,
        node_rank,
        rank,
        local_rank,
        stream or "",
        raw[m.end() :],
        raw[:TS_LEN],
    )


SECOND = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", re.ASCII)


def number(digits: str | None) -> int | None:
    """A rank's digits as a number; None when there are none, or more than Python's int() takes
    (4300 digits, `sys.get_int_max_str_digits`): a line a job printed never stops a reader."""
    if digits is None:
        return None
    try:
        return int(digits)
    except ValueError:
        return None


def global_rank(local_rank: int | None, trainer: str | None, base_rank: int | None) -> int | None:
    """A worker line's global rank: the trainer's `[rank R] ` when present (None when it is more
    digits than a number takes), else `base_rank + local_rank` (static rendezvous: a node's workers
    are base_rank..base_rank+nproc-1), else None."""
    if trainer is not None:
        try:  # `number(trainer)`, inline: most lines come here
            return int(trainer)
        except ValueError:
            return None
    if local_rank is not None and base_rank is not None:
        return base_rank + local_rank
    return None


def valid_second(sec: str) -> int | None:
    """The epoch of a `YYYY-MM-DDTHH:MM:SS` (cached as the last one), None if it is no date."""
    if sec == _parse_cache.prefix:
        return _parse_cache.epoch
    if SECOND.fullmatch(sec) is None:
        return None
    try:
        return _parse_cache.epoch_of(sec)
    except ValueError:
        return None


def read_node_lines(lines: Iterable[str], node: str, node_rank: int, base_rank: int | None) -> Iterator[LogLine]:
    """Parse a node's log lines in file order; an unparsable line inherits the previous time."""
    last, stamp = 0.0, ""
    for raw in lines:
        line = parse_node_line(raw, node, node_rank, base_rank, fallback_ts=last, fallback_stamp=stamp)
        last, stamp = line.ts, line.stamp
        yield line


def merge_key(line: LogLine, offsets_ms: Mapping[str, float] | None) -> float:
    """The time a line is ordered by: node time minus the node's measured clock offset."""
    return line.ts - (offsets_ms or {}).get(line.node, 0.0) / 1000.0


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
    return rank_text(line.rank)


def rank_text(rank: int | None) -> str:
    return f"r{rank}" if rank is not None else "-"


def last_state(text: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns: its last state."""
    return text.rstrip("\r").rsplit("\r", 1)[-1]


# ----------------------------------------------------------------------------- safe for a terminal

UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""What text from a node must not send raw to a terminal (a regular-expression class): the C0
controls but TAB and newline (ESC starts the sequences that retitle a window, clear the screen,
move the cursor, answer back or write a hyperlink; CR overwrites the row), DEL, the C1 controls
(U+0080-U+009F: U+009B is an 8-bit CSI), and the marks and overrides that reorder bidirectional
text (U+200E/F, U+202A-U+202E, U+2066-U+2069), which make a line read otherwise than it is.
`_fastmerge.c` escapes the same set, byte for byte the same way."""
_UNSAFE = re.compile(f"[{UNSAFE}]")
_SGR_OR_UNSAFE = re.compile(f"(\x1b\\[[0-9;]*m)|[{UNSAFE}]")
"""An SGR sequence exactly (`ESC [ digits and semicolons m`: colours and attributes, nothing
else), or an unsafe character."""


def _escape(m: re.Match[str]) -> str:
    """An unsafe character as Python would write it in a literal: `\\x1b`, `\\r`, `\\u202e`."""
    return m.group().encode("unicode_escape").decode("ascii")


def _escape_but_sgr(m: re.Match[str]) -> str:
    return m.group() if m.group(1) else _escape(m)


def printable(text: str, *, sgr: bool = False) -> str:
    """Text from a node (a log line, a check's value or detail, an error quoting its stderr), safe
    to write to a terminal: every character of `UNSAFE` shown as its escape (`\\x1b`, `\\r`,
    `\\x9b`, `\\u202e`), TAB and newline kept. With `sgr` (colour on a terminal), the job's own
    SGR colour sequences are kept when they are exactly SGR. Backslashes are left as they are: the
    escapes make a control visible, they are not a lossless encoding (the stored copies are)."""
    if text.isprintable():  # no control, format or separator character at all: the usual line
        return text
    if sgr:
        return _SGR_OR_UNSAFE.sub(_escape_but_sgr, text)
    return _UNSAFE.sub(_escape, text)


_JSON_RAW = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What json.dumps(ensure_ascii=False) leaves raw of `UNSAFE` (it escapes the C0 controls)."""


def json_safe(text: str) -> str:
    """A JSON document with the unsafe characters json.dumps leaves raw written as `\\uXXXX`
    escapes: the same document to a JSON reader, safe on a terminal (they occur only in strings)."""
    if text.isascii() and "\x7f" not in text:
        return text
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def format_line(line: LogLine, color: bool, *, node_width: int = 0, rank_width: int = 0, raw: bool = False) -> str:
    """`TIME NODE RANK TEXT`, columns padded to the given widths; never wrapped or cut.
    With colour: the node in its own colour, the time dim, stderr text red. JSON keeps the text
    verbatim; here a line redrawn with carriage returns shows only its last state, and the text is
    `printable` (the job's SGR colours kept only with colour), unless `raw` (`orch logs --raw`)."""
    node = line.node.ljust(node_width)
    rank = rank_label(line).rjust(rank_width)
    stamp = line.stamp or format_ts(line.ts)
    text = line.text
    if "\r" in text:  # a progress bar redrawn in place: show what the terminal would show last
        text = last_state(text)
    if not raw:
        text = printable(text, sgr=color)
    if not color:
        return f"{stamp} {node} {rank} {text}"
    if "\x1b[" in text:  # the job's own colours end with its line
        text += RESET
    if line.stream == "err":
        text = f"{RED}{text}{RESET}"
    elif line.stream == "orch":
        text = f"{DIM}{text}{RESET}"
    return f"{DIM}{stamp}{RESET} {node_color(line.node)}{node}{RESET} {rank} {text}"


def to_json(line: LogLine) -> str:
    """One docs/CONTRACT.md logs object (plus `stream`): the text exactly as written, every
    control character escaped by JSON; `node_rank` null for the controller's own lines (-1)."""
    return json_safe(
        json.dumps(
            {
                "ts": line.stamp or format_ts(line.ts),
                "node": line.node,
                "node_rank": line.node_rank if line.node_rank >= 0 else None,
                "rank": line.rank,
                "local_rank": line.local_rank,
                "line": line.text,
                "stream": line.stream,
            },
            ensure_ascii=False,
            allow_nan=False,
        )
    )


def column_widths(nodes: Iterable[str], world_size: int | None) -> tuple[int, int]:
    """Widths of the node and rank columns for a run, so every line aligns from the start."""
    node_width = max((len(n) for n in nodes), default=0)
    rank_width = len(f"r{max(0, (world_size or 1) - 1)}")
    return node_width, rank_width
