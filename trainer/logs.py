"""Rank-prefixed output: every line the trainer prints starts with ``[rank R] `` and is flushed.

The orchestrator's log parser attributes lines to ranks by that prefix, so it also goes in front
of ultralytics' own log lines and Python warnings.
"""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass
from typing import TextIO

_PREFIX = "[rank 0] "


def set_rank(rank: int) -> None:
    """Set the prefix for every later line of this process."""
    global _PREFIX
    _PREFIX = f"[rank {rank}] "


def prefixed(text: str) -> str:
    """``text`` with the rank prefix in front of each of its lines."""
    return "\n".join(_PREFIX + line for line in str(text).splitlines() or [""])


def say(text: str, stream: TextIO | None = None) -> None:
    """Print ``text`` with the rank prefix on each line, then flush (logs are streamed live)."""
    out = stream or sys.stdout
    out.write(prefixed(text) + "\n")
    out.flush()


class _PrefixFormatter(logging.Formatter):
    """Formats ultralytics' records with the rank prefix on every line."""

    def format(self, record: logging.LogRecord) -> str:
        """Prefix each line of the formatted record."""
        return prefixed(super().format(record))


def route_library_output() -> None:
    """Give ultralytics' logger and Python warnings the rank prefix (imports ultralytics)."""
    import ultralytics.utils  # noqa: F401  (its import installs the handlers we re-format)

    logger = logging.getLogger("ultralytics")
    for handler in logger.handlers:
        handler.setFormatter(_PrefixFormatter("%(message)s"))

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        say(f"{category.__name__}: {message} ({filename}:{lineno})", sys.stderr)

    warnings.showwarning = show


@dataclass
class StepMeter:
    """Images and time of one rank over a window of steps, split into data wait and compute."""

    images: int = 0
    """Images this rank trained on in the window."""
    wait_s: float = 0.0
    """Seconds spent waiting for the data loader."""
    total_s: float = 0.0
    """Wall seconds of the window (wait + compute + communication)."""

    def add(self, images: int, wait_s: float, total_s: float) -> None:
        """Account one step."""
        self.images += images
        self.wait_s += wait_s
        self.total_s += total_s

    @property
    def ips(self) -> float:
        """This rank's images per second."""
        return self.images / self.total_s if self.total_s > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """Fraction of the time spent waiting for data."""
        return self.wait_s / self.total_s if self.total_s > 0 else 0.0


def throughput_table(epoch: int, rows: list[list[float]], ref_ips: float | None) -> str:
    """The end-of-epoch table: one line per rank, then the job total and scaling efficiency.

    Args:
        epoch: 1-based epoch number.
        rows: ``[images, wait_s, total_s]`` of every rank, in rank order.
        ref_ips: single-rank images/s to compare against (``--ref-ips``), if known.
    """
    lines = [f"throughput epoch {epoch}: rank  images/s  data-wait"]
    total = 0.0
    for rank, (images, wait_s, total_s) in enumerate(rows):
        ips = images / total_s if total_s > 0 else 0.0
        total += ips
        share = wait_s / total_s if total_s > 0 else 0.0
        lines.append(f"throughput epoch {epoch}: {rank:>4}  {ips:8.1f}  {share:8.1%}")
    summary = f"throughput epoch {epoch}: total {total:.1f} images/s over {len(rows)} ranks"
    if ref_ips:
        summary += f", scaling efficiency {total / (len(rows) * ref_ips):.1%} of {len(rows)} x {ref_ips:g} images/s"
    lines.append(summary)
    return "\n".join(lines)
