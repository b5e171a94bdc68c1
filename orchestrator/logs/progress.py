"""Where a trainer run is, read from the node logs: rank 0's lines of the node that holds it
(`Progress`, from the trainer's own parsers in `trainer.py`), for `orch status` (`status_progress`)
and the report's phases (`rank0_lines`).

Its own module, above both `lines.py` (which parses a node.log line) and `trainer.py` (the door to
the trainer's lines): reading progress needs the two, and neither needs it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ..store import RunDir, RunStore
from .lines import parse_node_line
from .trainer import Progress

if TYPE_CHECKING:  # the report's type only: reading progress (the HTML report does) loads no run/ code
    from ..run.control import StatusReport


def progress_of(raw_lines: Iterable[str]) -> Progress | None:
    """Where a trainer run is, from node.log lines (`<UTC µs>Z <stream> <text>`) of the node that
    holds rank 0, oldest first: only rank 0's lines count. None when no progress line was seen
    (not the trainer, or not training yet)."""
    progress, last = Progress(), 0.0
    for raw in raw_lines:
        line = parse_node_line(raw, "", 0, 0, fallback_ts=last)
        last = line.ts
        if line.rank == 0:
            progress.feed(line.text, line.ts)
    return progress if progress.known else None


def run_progress(run: RunDir, master: str, fresh: Iterable[str] = ()) -> Progress | None:
    """A run's progress from the controller's copy of its master's log (`nodes/<master>.log`,
    complete while `orch up` follows the run), then `fresh` (the master's latest lines, asked of
    its agent), which the copy may not have yet."""
    try:
        with open(run.node_log(master), encoding="utf-8", errors="replace") as fh:
            return progress_of(itertools.chain(fh, fresh))
    except OSError:
        return progress_of(fresh)


def status_progress(report: StatusReport) -> Progress | None:
    """The trainer's progress of a run `orch status` just asked of (`run.control.status`): its
    master's copy, then the lines its agent answered (`master_tail`); None without a node of
    rank 0 or a progress line."""
    master = report.master
    return run_progress(RunStore().get(report.run), master, report.master_tail) if master else None


def rank0_lines(raw_lines: Iterable[str]) -> Iterator[tuple[float, str]]:
    """`(time, text)` of rank 0's lines among node.log lines, in file order, as they are read
    (what `parse_phases` reads)."""
    last = 0.0
    for raw in raw_lines:
        line = parse_node_line(raw, "", 0, 0, fallback_ts=last)
        last = line.ts
        if line.rank == 0:
            yield line.ts, line.text
