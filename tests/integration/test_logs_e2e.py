"""Done-when check: `orch logs --follow` on a running 4-node job (real sshd, real torchrun, started
by `orch up --detach`) shows every node's lines, in time order, about a second after they are
written, and ends by itself when the job ends."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.logs.lines import LogLine, parse_ts
from orchestrator.logs.merge import LiveMerge
from tests.cluster import TestCluster
from tests.logs_support import late_inversions
from tests.ports import job_port
from tests.up_helpers import node_log, run_root

# foreground: bounds the follow's lag (median 1.5 s, max 5 s)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.foreground]
REPO = Path(__file__).resolve().parents[2]


def lost(cluster: TestCluster, rank: int, count: int, seqs: list[int], objs: list[dict[str, Any]]) -> str:
    """What a failed count shows: the missing seqs, where the node's own log has them, and this
    rank's lines that `orch logs` printed but that do not start with `seq=` (a torn or merged line)."""
    gone = sorted(set(range(count)) - set(seqs))
    doubled = sorted({s for s in seqs if seqs.count(s) > 1})
    log = node_log(run_root(cluster), "e2e", f"node{rank // 2 + 1}").splitlines()
    there = [ln for ln in log if f"[rank {rank}] " in ln and any(f" seq={m} " in ln for m in gone)]
    odd = [o["line"] for o in objs if o["rank"] == rank and not o["line"].startswith("seq=")]
    return (
        f"rank {rank}: missing {gone[:10]}, doubled {doubled[:10]}; in node.log: {there[:5]}; "
        f"its other lines: {odd[:5]}"
    )


def test_logs_follow_on_a_running_4_node_job(cluster: TestCluster, tmp_path: Path) -> None:
    inv = cluster.write_inventory(
        job={
            "script": str(REPO / "tests" / "logs_job.py"),
            "nproc_per_node": 2,
            "workdir": str(REPO),
            "stop_grace_s": 5,
        },
        env={"LOGS_JOB_SECONDS": "8", "GLOO_SOCKET_IFNAME": "lo"},
        master={"port": job_port()},
    )
    env = dict(os.environ, ORCH_HOME=str(tmp_path / "home"), NO_COLOR="1")
    env.pop("ORCH_INVENTORY", None)
    orch = [sys.executable, "-m", "orchestrator"]
    up = subprocess.run(
        [*orch, "up", str(inv), "--detach", "--skip-checks", "--run-id", "e2e"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert up.returncode == 0, up.stderr
        follow = subprocess.Popen(
            [*orch, "logs", "e2e", "--follow", "--json"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert follow.stdout is not None
        got = [(time.time(), json.loads(raw)) for raw in follow.stdout]
        code = follow.wait(timeout=60)
        err = follow.stderr.read() if follow.stderr else ""
    finally:
        subprocess.run([*orch, "down", "e2e"], cwd=REPO, env=env, capture_output=True, timeout=120)
    assert code == 0, err
    objs = [o for _, o in got]
    assert {o["node"] for o in objs} == {"node1", "node2", "node3", "node4"}
    for rank in range(8):
        mine = [o for o in objs if o["rank"] == rank and o["line"].startswith("seq=")]
        count = int(mine[0]["line"].rsplit(" ", 1)[1])
        seqs = [int(o["line"].split()[0][4:]) for o in mine]
        assert sorted(seqs) == list(range(count)), lost(cluster, rank, count, seqs, objs)
        # stdout and stderr reach the agent through two pipes, so only each stream keeps its order
        for stream in ("out", "err"):
            own = [s for s, o in zip(seqs, mine) if o["stream"] == stream]
            assert own == sorted(own), f"rank {rank} {stream} reordered"
        assert {o["node_rank"] for o in objs if o["rank"] == rank} == {rank // 2}
        assert {o["local_rank"] for o in objs if o["rank"] == rank} == {rank % 2}
    out = [
        (t, LogLine(parse_ts(o["ts"]), o["node"], o["node_rank"], o["rank"], o["local_rank"], o["stream"], o["line"]))
        for t, o in got
    ]
    bad, inversions = late_inversions(out, LiveMerge.HEARTBEAT_MARGIN)
    assert not bad, f"{len(bad)} lines out of time order although they arrived in time:\n" + "\n".join(bad[:5])
    assert any(o["stream"] == "err" for o in objs) and any(o["stream"] == "orch" for o in objs)
    # Lag once the follow is under way (skip its first 2 s: connecting and catching up).
    first = got[0][0]
    lag = [t - parse_ts(o["ts"]) for t, o in got if t > first + 2]
    print(
        f"orch logs --follow lag: median {statistics.median(lag):.3f} s, max {max(lag):.3f} s over {len(lag)} "
        f"lines; {inversions} late lines out of order"
    )
    assert statistics.median(lag) < 1.5 and max(lag) < 5.0
