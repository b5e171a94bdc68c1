"""What orch reads of the trainer's output (`python -m trainer`): the rank prefix of every line,
the end-of-epoch throughput table, every rank's timing windows (the straggler detector's
input), the epoch and validation lines (results.csv's columns), the
final validation of best.pt, and where the run's weights and results.csv were saved.

Those lines are defined once, in `trainer/logs.py`, which both writes and parses them, so the
trainer and orch cannot drift apart; it is stdlib-only (no torch, no ultralytics), so importing it
on the controller costs nothing. This module is orch's one door to it: `lines.py` takes the rank
prefix from here, `orchestrator/report.py` the rest. (The C merge, `_fastmerge.c`, reads the rank
prefix too.)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path

from trainer.logs import (
    RANK_PREFIX,
    RESULTS_PATH,
    THROUGHPUT_ROW,
    THROUGHPUT_TOTAL,
    WEIGHTS_DIR,
    Phase,
    Progress,
    Throughput,
    Timing,
    announced,
    parse_final,
    parse_phases,
    parse_results,
    parse_throughput,
    parse_throughput_epochs,
    parse_timing,
)

__all__ = ["RANK_PREFIX", "RESULTS_PATH", "THROUGHPUT_ROW", "THROUGHPUT_TOTAL", "WEIGHTS_DIR", "Phase", "Progress",
           "Throughput", "Timing", "announced", "parse_final", "parse_phases", "parse_results", "parse_throughput",
           "parse_throughput_epochs", "parse_timing", "progress_of", "rank0_lines",
           "run_progress"]


def progress_of(raw_lines: Iterable[str]) -> Progress | None:
    """Where a trainer run is, from node.log lines (`<UTC µs>Z <stream> <text>`) of the node that
    holds rank 0, oldest first: only rank 0's lines count. None when no progress line was seen
    (not the trainer, or not training yet)."""
    from .lines import parse_node_line

    progress, last = Progress(), 0.0
    for raw in raw_lines:
        line = parse_node_line(raw, "", 0, 0, fallback_ts=last)
        last = line.ts
        if line.rank == 0:
            progress.feed(line.text, line.ts)
    return progress if progress.known else None


def run_progress(run_path: Path, master: str, fresh: Iterable[str] = ()) -> Progress | None:
    """A run's progress from the controller's copy of its master's log (`nodes/<master>.log`,
    complete while `orch up` follows the run), then `fresh` (the master's latest lines, asked of
    its agent), which the copy may not have yet."""
    copy = run_path / "nodes" / f"{master}.log"
    try:
        with open(copy, encoding="utf-8", errors="replace") as fh:
            return progress_of(itertools.chain(fh, fresh))
    except OSError:
        return progress_of(fresh)


def rank0_lines(raw_lines: Iterable[str]) -> Iterator[tuple[float, str]]:
    """`(time, text)` of rank 0's lines among node.log lines, in file order, as they are read
    (what `parse_phases` reads)."""
    from .lines import parse_node_line

    last = 0.0
    for raw in raw_lines:
        line = parse_node_line(raw, "", 0, 0, fallback_ts=last)
        last = line.ts
        if line.rank == 0:
            yield line.ts, line.text
