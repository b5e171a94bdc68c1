"""What `orch logs --node/--rank/--grep/--since/--tail/--no-telemetry` keep: the options parsed (a clear
UsageError for a bad one) and the filter applied to streams of lines. Pure.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from ..config.nodeset import expand
from ..errors import UsageError
from .lines import LogLine, merge_key
from .telemetry import is_metrics


def parse_ranks(spec: str) -> frozenset[int]:
    """`0,8-15` → {0, 8, ..., 15}. Raises UsageError on anything else."""
    ranks: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise UsageError(
                f"bad --rank '{spec}': '{part}' is not a rank or a range", "use e.g. --rank 0 or --rank 0,8-15"
            )
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise UsageError(f"bad --rank '{spec}': range {lo}-{hi} is backwards", "write low-high, e.g. 8-15")
        ranks.update(range(lo, hi + 1))
    return frozenset(ranks)


def parse_nodes(spec: str, known: Iterable[str]) -> frozenset[str]:
    """Node names or ClusterShell ranges (`node[1-2],node4`) → the matching known node names."""
    wanted = set(expand(spec, "--node"))
    known = list(known)
    unknown = sorted(wanted - set(known))
    if unknown:
        raise UsageError(
            f"--node: no node named {', '.join(unknown)} in this run", "nodes of this run: " + ", ".join(known)
        )
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
        raise UsageError(
            f"bad --since '{spec}'", "give a duration (30s, 10m, 2h, 1d) or a UTC time (2026-11-30T09:30:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


@dataclass(frozen=True)
class LineFilter:
    """What `--node/--rank/--grep/--since/--no-telemetry` keep. Empty fields keep everything."""

    nodes: frozenset[str] | None = None
    ranks: frozenset[int] | None = None
    pattern: re.Pattern[str] | None = None
    since: float | None = None
    offsets_ms: Mapping[str, float] | None = None
    metrics: bool = True
    """False: leave out the agents' telemetry lines and the ranks' timing lines (`is_metrics`)."""

    def wants_node(self, node: str) -> bool:
        return self.nodes is None or node in self.nodes

    def __call__(self, line: LogLine) -> bool:
        if self.nodes is not None and line.node not in self.nodes:
            return False
        if self.ranks is not None and line.rank not in self.ranks:
            return False
        if self.since is not None and merge_key(line, self.offsets_ms) < self.since:
            return False
        if not self.metrics and is_metrics(line):
            return False
        return self.pattern is None or self.pattern.search(line.text) is not None

    @property
    def empty(self) -> bool:
        return (
            self.nodes is None and self.ranks is None and self.pattern is None and self.since is None and self.metrics
        )


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
