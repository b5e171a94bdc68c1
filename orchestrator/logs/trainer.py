"""What orch reads of the trainer's output (`python -m trainer`; trainer/logs.py writes it): the
rank prefix of every line, the end-of-epoch throughput table, and where the run's weights and
results.csv were saved. The one module that parses these lines: `lines.py` takes the rank
prefix from here for every log line, `orchestrator/report.py` the rest. (The C merge,
`_fastmerge.c`, reads the rank prefix too.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

RANK_PREFIX = r"\[rank (\d+)\] "
"""The prefix the trainer puts on every line it prints, as a regex: group 1 is the global rank."""

# `[rank 0] throughput epoch 3:    1     41.2     12.5%` (the trainer's end-of-epoch table)
THROUGHPUT_ROW = re.compile(r"throughput epoch (\d+):\s+(\d+)\s+([\d.]+)\s+([\d.]+)%")
THROUGHPUT_TOTAL = re.compile(r"throughput epoch (\d+): total ([\d.]+) images/s over (\d+) ranks"
                              r"(?:, scaling efficiency ([\d.]+)%)?")
RESULTS_PATH = re.compile(r"(/\S+/results\.csv)\b")
WEIGHTS_DIR = re.compile(r"weights in (\S+?)[;,]?(?:\s|$)")


@dataclass
class Throughput:
    """The last epoch's per-rank figures the trainer printed."""

    epoch: int = 0
    ips: dict[int, float] = field(default_factory=dict)
    wait_share: dict[int, float] = field(default_factory=dict)
    total: float | None = None
    efficiency: float | None = None


def parse_throughput(lines: Iterable[str]) -> Throughput:
    """Keep the table of the latest epoch seen in the log."""
    tp = Throughput()
    for line in lines:
        m = THROUGHPUT_ROW.search(line)
        if m:
            epoch = int(m.group(1))
            if epoch > tp.epoch:
                tp = Throughput(epoch=epoch)
            if epoch == tp.epoch:
                tp.ips[int(m.group(2))] = float(m.group(3))
                tp.wait_share[int(m.group(2))] = float(m.group(4)) / 100
            continue
        m = THROUGHPUT_TOTAL.search(line)
        if m and int(m.group(1)) == tp.epoch:
            tp.total = float(m.group(2))
            tp.efficiency = float(m.group(4)) / 100 if m.group(4) else None
    return tp


def announced(lines: Iterable[str]) -> tuple[str | None, str | None]:
    """(weights directory, results.csv path): the last of each the trainer announced in the log."""
    weights = results = None
    for line in lines:
        m = WEIGHTS_DIR.search(line)
        if m:
            weights = m.group(1)
        m = RESULTS_PATH.search(line)
        if m:
            results = m.group(1)
    return weights, results
