"""The session's CPU lanes (tests/lanes.py): real cgroups of the v1 cpu controller, real processes
moved between them, and what a killed session left behind removed. Root only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import missing
from tests.lanes import (
    BG_SHARES,
    CPU_ROOT,
    FG_SHARES,
    PREFIX,
    Lanes,
    lane_of,
    reap_stale,
    reaping,
    unusable,
)
from tests.up_helpers import REPO


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
    made = Lanes.create(os.getpid())  # a live owner: another session's reap leaves it alone
    try:
        yield made
    finally:
        made.remove()


def test_a_process_moved_into_a_lane_is_there_with_what_it_starts_and_back_at_the_root_once_removed(
    lanes: Lanes, sleeper: subprocess.Popen[bytes]
) -> None:
    assert (lanes.path / "fg" / "cpu.shares").read_text().strip() == str(FG_SHARES)
    assert (lanes.path / "bg" / "cpu.shares").read_text().strip() == str(BG_SHARES)
    lanes.enter("fg", [sleeper.pid])
    assert lane_of(sleeper.pid) == lanes.path / "fg"
    lanes.enter("bg", [sleeper.pid, dead_pid()])  # a pid gone meanwhile is skipped
    assert lane_of(sleeper.pid) == lanes.path / "bg"
    # what a moved process starts afterwards is born in its lane
    shell = subprocess.Popen(
        ["sh", "-c", "read _; cat /proc/self/cgroup"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    lanes.enter("fg", [shell.pid])
    out, _ = shell.communicate("go\n", timeout=30)
    assert f":/{lanes.path.name}/fg\n" in out, out
    lanes.remove()
    assert not lanes.path.exists()
    assert lane_of(sleeper.pid) == CPU_ROOT  # the cgroup above the lanes
    with pytest.raises(ValueError, match="lane must be one of"):
        lanes.enter("middle", [sleeper.pid])


def test_the_lanes_of_a_session_whose_controller_is_gone_are_reaped_and_a_live_ones_kept(
    lanes: Lanes, sleeper: subprocess.Popen[bytes]
) -> None:
    live = Lanes.create(sleeper.pid)  # its "controller" is alive
    try:
        with reaping():  # no other session reaps it first
            stale = Lanes.create(dead_pid())
            stale.enter("bg", [sleeper.pid])
            removed = reap_stale(locked=True)
        assert f"cgroup {stale.path}" in removed and not stale.path.exists()
        assert lane_of(sleeper.pid) == CPU_ROOT  # moved out before its lane was removed
        assert live.path.exists() and f"cgroup {live.path}" not in removed
        assert lanes.path.exists() and f"cgroup {lanes.path}" not in removed
        assert all(p.name.startswith(PREFIX) for p in [stale.path, live.path])
    finally:
        live.remove()


SYNTHETIC = """
import json, os, time
from pathlib import Path

import pytest

LOG = Path(os.environ["LANES_LOG"])


def record(kind):
    start = time.monotonic()
    time.sleep(0.4)  # the test's work: something for the others to overlap with, or not
    lane = next(ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                if "cpu" in ln.split(":")[1].split(","))
    with open(LOG, "a") as fh:
        fh.write(json.dumps({"kind": kind, "start": start, "end": time.monotonic(), "lane": lane,
                             "worker": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")


@pytest.mark.parametrize("i", range(8))
def test_shared(i):
    record("shared")


@pytest.mark.slow
@pytest.mark.parametrize("i", range(6))
def test_slow(i):
    record("slow")


@pytest.mark.foreground
@pytest.mark.parametrize("i", range(4))
def test_foreground(i):
    record("foreground")


@pytest.mark.alone
@pytest.mark.parametrize("i", range(3))
def test_alone(i):
    record("alone")


@pytest.mark.waits
@pytest.mark.parametrize("i", range(3))
def test_waits(i):
    record("waits")
"""


def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_under_three_workers_alone_tests_overlap_nothing_and_foreground_ones_run_first_in_their_lane(
    tmp_path: Path,
) -> None:
    """A synthetic suite under the session's own hooks (tests/conftest.py as a plugin), three
    workers as `make test` runs them: what each test saw is logged, and the rules hold."""
    why = unusable()
    if why:
        missing(f"CPU lanes: {why}")
    (tmp_path / "test_synthetic.py").write_text(SYNTHETIC)
    (tmp_path / "setup.cfg").write_text(
        "[tool:pytest]\nmarkers =\n    slow: s\n    alone: a\n    foreground: f\n"
        "    netns: n\n    gpu: g\n    waits: w\n"
    )
    log = tmp_path / "log.jsonl"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-n",
            "3",
            "-q",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **{k: v for k, v in os.environ.items() if k not in ("ORCH_TEST_TIMELINE", "ORCH_TEST_LANES")},
            "LANES_LOG": str(log),
            "PYTHONPATH": str(REPO),
        },
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    runs = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert sorted(r["kind"] for r in runs) == sorted(
        ["shared"] * 8 + ["slow"] * 6 + ["foreground"] * 4 + ["alone"] * 3 + ["waits"] * 3
    )
    by = {k: [r for r in runs if r["kind"] == k] for k in ("shared", "slow", "foreground", "alone", "waits")}
    for a in by["alone"]:  # nothing beside an alone test
        assert not [r for r in runs if r is not a and overlaps(a, r)], a
    assert len({r["worker"] for r in by["alone"]}) == 1  # one unit of work
    assert len({r["worker"] for r in by["foreground"]}) == 1
    for a in by["foreground"]:  # one foreground test at a time, in the foreground lane
        assert not [r for r in by["foreground"] if r is not a and overlaps(a, r)]
        assert a["lane"].endswith("/fg"), a
    assert all(r["lane"].endswith("/bg") for r in by["shared"] + by["slow"] + by["waits"])
    # the waits tests: on the foreground tests' worker, after them
    assert {r["worker"] for r in by["waits"]} == {by["foreground"][0]["worker"]}
    assert min(r["start"] for r in by["waits"]) >= max(r["end"] for r in by["foreground"])
    assert any(overlaps(f, r) for f in by["foreground"] for r in by["shared"] + by["slow"])  # others went on beside
    events = sorted([(r["start"], 1) for r in by["slow"]] + [(r["end"], -1) for r in by["slow"]])
    running = [sum(step for _t, step in events[: i + 1]) for i in range(len(events))]
    assert max(running) <= max(1, os.cpu_count() or 1), running  # at most one slow shared test per core
    assert "no CPU lanes" not in p.stderr, p.stderr[-2000:]
