"""Shared benchmark plumbing: alternate the sides, warm up, take medians, write JSON."""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (timeout, kill) unwinds like Ctrl-C, so every test cluster a benchmark started is stopped."""
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminate)
REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    mem = 0
    try:
        with open("/proc/meminfo") as fh:
            mem = int(fh.readline().split()[1]) // 1024
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "memory_mb": mem,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def side_by_side(sides: dict[str, Callable[[], Any]], reps: int = 5, warmup: int = 1) -> dict[str, dict[str, Any]]:
    """Run every side `warmup` times, then `reps` rounds alternating the sides; medians in seconds."""
    for _ in range(warmup):
        for fn in sides.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(reps):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))  # no side always runs first
        for name in order:
            samples[name].append(timed(sides[name]))
    return {
        name: {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s), "samples_s": s}
        for name, s in samples.items()
    }


def write(name: str, data: dict[str, Any]) -> Path:
    """bench/results/<name>.json with the machine description added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "machine": machine(), **data}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
