"""What orch reads of the trainer's output (`python -m trainer`): the rank prefix of every line,
the end-of-epoch throughput table, every rank's timing windows (the straggler detector's
input), the epoch and validation lines (results.csv's columns), the
final validation of best.pt, and where the run's weights and results.csv were saved.

Those lines are defined once, in `trainer/logs.py`, which both writes and parses them, so the
trainer and orch cannot drift apart; it is stdlib-only (no torch, no ultralytics), so importing it
on the controller costs nothing. This module is orch's one door to it: `lines.py` takes the rank
prefix from here, `progress.py` the progress lines, `telemetry.py` and `stored.py` the timing
line's mark, `orchestrator/report.py` the rest. (The C merge, `_fastmerge.c`, reads the rank prefix too.)
"""

from __future__ import annotations

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
    timing_line,
)

TIMING_MARK = timing_line(0, 0, 0, 0, 0.0, 0.0, 0.0).partition("0")[0]
"""`timing epoch `: what a rank's timing line starts with (behind its prefixes), taken from the
trainer's own writer (`trainer/logs.py` `timing_line`), where it is written once."""

__all__ = [
    "RANK_PREFIX",
    "RESULTS_PATH",
    "THROUGHPUT_ROW",
    "THROUGHPUT_TOTAL",
    "TIMING_MARK",
    "WEIGHTS_DIR",
    "Phase",
    "Progress",
    "Throughput",
    "Timing",
    "announced",
    "parse_final",
    "parse_phases",
    "parse_results",
    "parse_throughput",
    "parse_throughput_epochs",
    "parse_timing",
]
