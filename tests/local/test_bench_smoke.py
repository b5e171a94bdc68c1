"""Benchmarks never run in the test suite; this only shows that every script starts (`--help`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS, LIBRARIES, TOOLS

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (REPO / "bench").glob("*.py") if p.stem not in ("__init__", "__main__", *LIBRARIES))


def test_every_script_is_a_benchmark_of_the_runner_or_a_tool() -> None:
    assert set(BENCHMARKS) | set(TOOLS) == set(SCRIPTS)
    assert not set(BENCHMARKS) & set(TOOLS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_starts(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    if name in BENCHMARKS:
        assert "--quick" in proc.stdout


def test_check_fanout_refuses_an_unknown_side() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.check_fanout", "--sides", "pdsh_date,nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "unknown side(s) nope" in proc.stderr, proc.stderr[-2000:]
