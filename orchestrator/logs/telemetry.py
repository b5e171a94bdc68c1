"""The node agents' telemetry lines and the trainer's timing lines, read back from node log lines. Pure.

A telemetry line is the agent's own (`orch` stream) `telemetry {json}` (`node/telemetry.py` writes
it and defines its mark, `PREFIX`; its fields are docs/CONTRACT.md's). A timing line is a rank's
`timing epoch E batch B ...` (`trainer/logs.py` writes it; its mark, `TIMING_MARK`, through
`logs/trainer.py`). Both become what the straggler detector (`run/straggler.py`) and `orch top` use.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..node.telemetry import NOT_FOUND, PREFIX
from ..run.straggler import GpuLoad, NodeLoad, Window
from .lines import LogLine
from .trainer import TIMING_MARK, Timing, parse_timing

__all__ = ["PREFIX", "Ignored", "Sample", "is_metrics", "parse_sample", "read_record", "timing_window"]


def _num(value: Any) -> float | None:
    """A reading; None when missing or not a finite number (an older agent wrote `NaN`)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Gpu:
    index: int | None
    uuid: str | None
    name: str | None
    util_pct: float | None
    mem_used_mb: int | None
    mem_total_mb: int | None
    temp_c: float | None
    power_w: float | None
    sm_mhz: int | None
    throttle: tuple[str, ...] | None
    """The slowing throttle reasons active; None when nvidia-smi does not report them."""
    fan_pct: float | None
    error: str | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Gpu:
        throttle = d.get("throttle")
        return cls(
            _int(d.get("index")),
            _text(d.get("uuid")),
            _text(d.get("name")),
            _num(d.get("util_pct")),
            _int(d.get("mem_used_mb")),
            _int(d.get("mem_total_mb")),
            _num(d.get("temp_c")),
            _num(d.get("power_w")),
            _int(d.get("sm_mhz")),
            tuple(str(t) for t in throttle) if isinstance(throttle, list) else None,
            _num(d.get("fan_pct")),
            _text(d.get("error")),
        )


@dataclass(frozen=True)
class RankSample:
    rank: int
    local_rank: int | None
    pid: int | None
    cpu_pct: float | None
    rss_mb: float | None


@dataclass(frozen=True)
class Sample:
    """One node's telemetry at one moment."""

    node: str
    ts: float
    gpus: tuple[Gpu, ...]
    gpu_error: str | None
    cpu_pct: float | None
    load1: float | None
    ncpu: int | None
    mem_used_mb: int | None
    mem_total_mb: int | None
    ranks: tuple[RankSample, ...] = field(default=())

    def load(self) -> NodeLoad:
        """What the straggler detector's attribution needs of it (no nvidia-smi: no GPU, the ranks
        compute on the CPU)."""
        return NodeLoad(
            self.node,
            self.cpu_pct,
            {r.rank: r.cpu_pct for r in self.ranks},
            tuple(GpuLoad(g.index, g.util_pct, g.temp_c, g.throttle or ()) for g in self.gpus),
            no_gpu=not self.gpus and self.gpu_error == NOT_FOUND,
            gpu_error=self.gpu_error,
        )


def parse_sample(line: LogLine) -> Sample | None:
    """The sample a node's telemetry line carries; None for any other line (or a broken one)."""
    if line.stream != "orch" or not line.text.startswith(PREFIX):
        return None
    try:
        d = json.loads(line.text[len(PREFIX) :])
        if not isinstance(d, dict):
            return None
        return _sample(line, d)
    except (ValueError, OverflowError, RecursionError):  # not JSON, too deep; a number no float holds
        return None


def _sample(line: LogLine, d: dict[str, Any]) -> Sample:
    gpus = tuple(Gpu.from_json(g) for g in _list(d.get("gpus")) if isinstance(g, dict))
    ranks = tuple(
        RankSample(
            int(r["rank"]), _int(r.get("local_rank")), _int(r.get("pid")), _num(r.get("cpu_pct")), _num(r.get("rss_mb"))
        )
        for r in _list(d.get("ranks"))
        if isinstance(r, dict) and _int(r.get("rank")) is not None
    )
    return Sample(
        line.node,
        line.ts,
        gpus,
        _text(d.get("gpu_error")),
        _num(d.get("cpu_pct")),
        _num(d.get("load1")),
        _int(d.get("ncpu")),
        _int(d.get("mem_used_mb")),
        _int(d.get("mem_total_mb")),
        ranks,
    )


def is_metrics(line: LogLine) -> bool:
    """A node agent's telemetry line or a rank's timing line: what `orch top` and the straggler
    detector read, and `orch logs --no-telemetry` leaves out."""
    if line.stream == "orch":
        return line.text.startswith(PREFIX)
    return timing_window(line) is not None


@dataclass(frozen=True)
class Ignored:
    """A line that starts as a telemetry or a timing record and is not one of finite numbers (a
    broken JSON, `wall_s 1e999`, a negative time): ignored by the detector and `orch top`, counted."""

    node: str


def read_record(line: LogLine, offset_s: float = 0.0) -> Sample | tuple[Window, Timing] | Ignored | None:
    """What the straggler detector and `orch top` read of a node log line: its telemetry sample, its
    timing window (`timing_window`), `Ignored` for a line that starts as one and is not a finite
    record, None for every other line."""
    if line.stream == "orch":
        if not line.text.startswith(PREFIX):
            return None
        return parse_sample(line) or Ignored(line.node)
    if line.rank is None or TIMING_MARK not in line.text or _TIMING_HEAD.search(line.text) is None:
        return None
    return timing_window(line, offset_s) or Ignored(line.node)


_TIMING_HEAD = re.compile(r"(?:^|\] )" + re.escape(TIMING_MARK))
"""A timing line's mark at the start of its text, or behind a prefix of its own (`[...] `)."""


def timing_window(line: LogLine, offset_s: float = 0.0) -> tuple[Window, Timing] | None:
    """A rank's timing line as the detector's window (its time on the reference clock: the
    node's minus `offset_s`), with the timing itself; None for any other line."""
    if line.rank is None or TIMING_MARK not in line.text:
        return None
    t = parse_timing(line.text)
    if t is None:
        return None
    return Window(
        line.node,
        line.rank,
        line.local_rank,
        t.epoch,
        t.batch,
        t.steps,
        t.data_s,
        t.compute_s,
        t.wall_s,
        line.ts - offset_s,
    ), t
