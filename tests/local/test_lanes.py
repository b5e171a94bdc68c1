"""The session's CPU lanes (tests/lanes.py): real cgroups of the v1 cpu controller, real processes
moved between them, and what a killed session left behind removed. Root only."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.cluster import missing
from tests.lanes import BG_SHARES, CPU_ROOT, FG_SHARES, PREFIX, Lanes, lane_of, reap_stale, unusable


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def dead_pid() -> int:
    """A pid that was a process of this machine and is no more."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def lanes() -> Iterator[Lanes]:
    why = unusable()
    if why:
        missing(f"CPU lanes: {why}")
    made = Lanes.create(dead_pid())
    try:
        yield made
    finally:
        made.remove()


def test_a_process_moved_into_a_lane_is_there_with_what_it_starts_and_back_at_the_root_once_removed(
        lanes: Lanes, sleeper: subprocess.Popen[bytes]) -> None:
    assert (lanes.path / "fg" / "cpu.shares").read_text().strip() == str(FG_SHARES)
    assert (lanes.path / "bg" / "cpu.shares").read_text().strip() == str(BG_SHARES)
    lanes.enter("fg", [sleeper.pid])
    assert lane_of(sleeper.pid) == lanes.path / "fg"
    lanes.enter("bg", [sleeper.pid, dead_pid()])  # a pid gone meanwhile is skipped
    assert lane_of(sleeper.pid) == lanes.path / "bg"
    # what a moved process starts afterwards is born in its lane
    shell = subprocess.Popen(["sh", "-c", "read _; cat /proc/self/cgroup"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    lanes.enter("fg", [shell.pid])
    out, _ = shell.communicate("go\n", timeout=30)
    assert f":/{lanes.path.name}/fg\n" in out, out
    lanes.remove()
    assert not lanes.path.exists()
    assert lane_of(sleeper.pid) == CPU_ROOT  # the cgroup above the lanes
    with pytest.raises(ValueError, match="lane must be one of"):
        lanes.enter("middle", [sleeper.pid])


def test_the_lanes_of_a_session_whose_controller_is_gone_are_reaped_and_a_live_ones_kept(
        lanes: Lanes, sleeper: subprocess.Popen[bytes]) -> None:
    live = Lanes.create(sleeper.pid)  # its "controller" is alive
    try:
        lanes.enter("bg", [sleeper.pid])
        removed = reap_stale()
        assert f"cgroup {lanes.path}" in removed and not lanes.path.exists()
        assert lane_of(sleeper.pid) == CPU_ROOT  # moved out before its lane was removed
        assert live.path.exists() and f"cgroup {live.path}" not in removed
        assert all(p.name.startswith(PREFIX) for p in [lanes.path, live.path])
    finally:
        live.remove()
